"""Runtime layer: llama.cpp in-process, the only code importing `llama_cpp` (model and contexts, devices, RPC,
sampling, chat template, KV primitives, RoPE re-anchor, attention capture, vocabulary). Imports no other layer."""
