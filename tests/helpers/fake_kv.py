"""Re-export of `evoke_engine.kv_sim` (the simulated KV cache moved into the package)."""

from evoke_engine.kv_sim import Cell, FakeCells, FakeKVCache, FakeKVViolation, FakeRuntime, ToyVocab, pack, unpack  # noqa: F401
