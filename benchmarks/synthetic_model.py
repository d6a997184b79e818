"""A GGUF with random weights in the shape of a real model, for KV benches on big-model geometry.

Invariants: only the shape is real (layers, heads, KV heads, head size, FFN width); weights are
random Q8_0 blocks, and the tokenizer and chat template are the embedded model's (its vocabulary).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evoke_engine.runtime.runtime import default_model_path


@dataclass(frozen=True)
class Shape:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rope_base: float = 1_000_000.0
    n_ctx_train: int = 32768


QWEN25_7B = Shape("qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944)
QWEN25_05B = Shape("qwen2", n_layer=24, n_embd=896, n_head=14, n_head_kv=2, n_ff=4864)    # head_dim 64
TINY = Shape("qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)   # for the test
SHAPES = {"qwen2.5-7b": QWEN25_7B, "qwen2.5-0.5b": QWEN25_05B, "tiny": TINY}

_Q8_BLOCK = 32
_WEIGHT_STD = 0.02


def _q8_0_bytes(rows: int, cols: int, pool: np.ndarray) -> np.ndarray:
    """Random Q8_0 data for a (rows, cols) weight: per 32 values an f16 scale and 32 int8."""
    n_blocks = rows * cols // _Q8_BLOCK
    scale = np.full((n_blocks, 1), _WEIGHT_STD / 73.0, dtype=np.float16).view(np.uint8)   # int8 std ~73
    quants = np.resize(pool, (n_blocks, _Q8_BLOCK))
    return np.concatenate([scale, quants], axis=1).reshape(rows, cols // _Q8_BLOCK * 34)


def write(path: Path, shape: Shape = QWEN25_7B, seed: int = 0) -> Path:
    """Write the GGUF (Q8_0 matrices, f32 norms and biases) and return its path."""
    import gguf  # bench-only dependency (the dev extra)

    source = gguf.GGUFReader(str(default_model_path()))
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    pool = np.random.default_rng(seed).integers(-127, 128, size=1 << 22, dtype=np.int8).view(np.uint8)
    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(f"synthetic {shape.arch} {shape.n_layer}L random weights")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        w.add_string(key, source.fields[key].contents())
    w.add_token_list(source.fields["tokenizer.ggml.tokens"].contents())
    w.add_token_types(source.fields["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(source.fields["tokenizer.ggml.merges"].contents())
    for key in ("bos", "eos", "padding"):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", source.fields[f"tokenizer.ggml.{key}_token_id"].contents())
    w.add_bool("tokenizer.ggml.add_bos_token", False)

    head_dim = shape.n_embd // shape.n_head
    kv_dim = head_dim * shape.n_head_kv
    q8 = gguf.GGMLQuantizationType.Q8_0

    def matrix(name: str, rows: int, cols: int) -> None:      # llama.cpp shape (cols, rows): rows outputs
        w.add_tensor(name, _q8_0_bytes(rows, cols, pool), raw_dtype=q8)   # byte shape: (rows, cols/32*34)

    def vector(name: str, n: int, value: float) -> None:
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    matrix("token_embd.weight", vocab, shape.n_embd)
    for i in range(shape.n_layer):
        vector(f"blk.{i}.attn_norm.weight", shape.n_embd, 1.0)
        for part, rows in (("q", shape.n_embd), ("k", kv_dim), ("v", kv_dim)):
            matrix(f"blk.{i}.attn_{part}.weight", rows, shape.n_embd)
            vector(f"blk.{i}.attn_{part}.bias", rows, 0.0)
        matrix(f"blk.{i}.attn_output.weight", shape.n_embd, shape.n_embd)
        vector(f"blk.{i}.ffn_norm.weight", shape.n_embd, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", shape.n_ff, shape.n_embd)
        matrix(f"blk.{i}.ffn_up.weight", shape.n_ff, shape.n_embd)
        matrix(f"blk.{i}.ffn_down.weight", shape.n_embd, shape.n_ff)
    vector("output_norm.weight", shape.n_embd, 1.0)
    matrix("output.weight", vocab, shape.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    """`python -m benchmarks.synthetic_model OUT.gguf [--shape qwen2.5-7b|qwen2.5-0.5b|tiny]`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.synthetic_model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    args = parser.parse_args()
    print(write(args.out, SHAPES[args.shape]))


if __name__ == "__main__":
    main()
