"""Re-export of `evoke_engine.kvcache.kv_sim` (the simulated KV cache moved into the package)."""

from evoke_engine.kvcache.kv_sim import (  # noqa: F401
    Cell,
    FakeCells,
    FakeKVCache,
    FakeKVViolation,
    FakeRuntime,
    ToyVocab,
    pack,
    unpack,
)
