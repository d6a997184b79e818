"""Unit tier: the engine's logic on plain objects and the fake KV cache (tests/helpers), no model."""
