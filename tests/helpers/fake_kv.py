"""Re-export of `benchmarks.kv_sim` (the simulated KV cache lives in the lab package, outside the wheel)."""

from benchmarks.kv_sim import (  # noqa: F401
    Cell,
    FakeCells,
    FakeKVCache,
    FakeKVViolation,
    FakeRuntime,
    ToyVocab,
    pack,
    unpack,
)
