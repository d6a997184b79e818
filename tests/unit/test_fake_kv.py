"""The fake KV cache keeps KVCache's signatures and its own rules (it claims nothing about llama.cpp)."""

from __future__ import annotations

import inspect

import pytest
from helpers.fake_kv import FakeKVCache, FakeKVViolation, FakeRuntime, unpack

from evoke_engine.errors import RestoreError
from evoke_engine.runtime.kv import KVCache, KVPrimitives, SavedKV

pytestmark = pytest.mark.unit

PRIMITIVES = [name for name in vars(KVPrimitives) if not name.startswith("_")]


def _params(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", PRIMITIVES)
def test_fake_and_real_share_every_primitive_signature(name):
    assert _params(getattr(FakeKVCache, name)) == _params(getattr(KVCache, name)) \
        == _params(getattr(KVPrimitives, name))


def test_the_protocol_lists_what_the_memory_calls():
    assert len(PRIMITIVES) >= 11 and {"save", "evict", "restore", "share", "drop", "claim_ahead"} <= set(PRIMITIVES)


def _kv() -> tuple[FakeRuntime, FakeKVCache]:
    rt = FakeRuntime()
    return rt, FakeKVCache(rt)


def test_payload_holds_the_tokens_at_their_positions():
    rt, kv = _kv()
    rt.decode([7, 8, 9, 10], 0, 0)
    saved = kv.save(0, 1, 3)
    assert (saved.origin_pos, saved.n_tokens) == (1, 2)
    assert unpack(saved.data) == (1, [(1, 8), (2, 9)])
    assert kv.layout(0) == [(0, 7), (1, 8), (2, 9), (3, 10)]          # save leaves the sequence alone


def test_restore_at_another_position_moves_the_tokens_there():
    rt, kv = _kv()
    rt.decode([7, 8, 9], 0, 0)
    saved = kv.save(0, 0, 3)
    kv.restore(saved, 1, 5)
    assert kv.layout(1) == [(5, 7), (6, 8), (7, 9)]
    assert kv.shift_pending                                            # re-anchored: applied by the next decode


def test_evict_compacts_and_queues_a_shift_that_a_save_applies_first():
    rt, kv = _kv()
    rt.decode([1, 2, 3, 4, 5], 0, 0)
    kv.evict(0, 1, 3)
    assert kv.layout(0) == [(0, 1), (1, 4), (2, 5)] and kv.cells.pending()
    kv.save(0, 0, 3)
    assert not kv.cells.pending() and kv.shift_flushes == 1 and not kv.cells.of(kv.scratch)


def test_a_shared_cell_moves_for_every_sequence_holding_it():
    rt, kv = _kv()
    rt.decode([1, 2, 3, 4], 0, 0)
    kv.share(0, 1, 2, 4)
    kv.evict(0, 0, 2)                                  # shifts [2, 4) of seq 0: the cells seq 1 shares
    assert kv.positions(1) == [0, 1]


def test_a_sequence_holds_one_cell_per_position():
    rt, kv = _kv()
    rt.decode([1, 2], 0, 0)
    with pytest.raises(FakeKVViolation):
        kv.restore(kv.save(0, 0, 2), 0, 1)


def test_decode_only_at_the_tail():
    rt, _ = _kv()
    rt.decode([1, 2], 0, 0)
    with pytest.raises(FakeKVViolation):
        rt.decode([3], 0, 5)


def test_foreign_bytes_and_full_cache_are_refused():
    rt = FakeRuntime(n_cells=4)
    kv = FakeKVCache(rt)
    with pytest.raises(RestoreError):
        kv.restore(SavedKV(bytearray(b"not a payload"), 0, 2), 0, 0)
    rt.decode([1, 2, 3], 0, 0)
    with pytest.raises(RestoreError):
        kv.restore(kv.save(0, 0, 3), 1, 0)


def test_claim_ahead_follows_the_kvcache_rules():
    rt, kv = _kv()
    rt.decode([1, 2, 3, 4], 0, 0)
    kv.hold_ahead(0, 2, [3, 4])
    assert kv.claim_ahead(0, 2, [3, 4, 5]) == 2 and kv.ahead_tokens(0) == 0
    kv.hold_ahead(0, 2, [3, 4])
    assert kv.claim_ahead(0, 2, [9, 9, 9]) == 0 and kv.layout(0) == [(0, 1), (1, 2)]   # a miss drops them


def test_an_older_block_restored_at_a_held_opening_moves_it_past_the_block_as_kvcache_does():
    rt, kv = _kv()
    rt.decode([1, 2, 3, 4, 5, 6], 0, 0)
    saved = kv.save(0, 0, 2)
    kv.evict(0, 0, 2)
    kv.flush_pending_shifts()
    rt.decode([90, 91, 40], 0, 4, logits_last=False)         # the role header, then a word of a draft
    kv.hold_ahead(0, 4, [90, 91, 40], opening=2)
    kv.restore(saved, 0, 4, before_opening=True)
    assert kv.layout(0) == [(0, 3), (1, 4), (2, 5), (3, 6), (4, 1), (5, 2), (6, 90), (7, 91)]
    assert kv.held_ahead(0) == [90, 91] and kv.shift_pending
    assert kv.claim_ahead(0, 6, [90, 91, 7]) == 2
    kv.reject_restores = 1
    rt.decode([92], 0, 8, logits_last=False)
    kv.hold_ahead(0, 8, [92], opening=1)
    with pytest.raises(RestoreError):
        kv.restore(saved, 0, 8, before_opening=True)
    assert kv.ahead_tokens(0) == 0 and kv.pos_max(0) == 7, "a refused restore leaves no opening past a gap"
    rt.decode([93], 0, 8, logits_last=False)
    kv.hold_ahead(0, 8, [93], opening=1)
    kv.restore(saved, 0, 8)                                        # the message's own block (a reuse): dropped
    assert kv.ahead_tokens(0) == 0 and kv.layout(0)[-2:] == [(8, 1), (9, 2)]


def test_the_tier_loads_no_model(tmp_path, monkeypatch):
    import llama_cpp
    from helpers.rig import Rig

    def refuse(*_args, **_kwargs):
        raise AssertionError("a unit test loaded a llama.cpp model")

    for name in ("llama_model_load_from_file", "llama_load_model_from_file", "llama_init_from_model"):
        monkeypatch.setattr(llama_cpp, name, refuse)
    rig = Rig(tmp_path)
    memory = rig.memory()
    for _ in range(12):
        rig.add(memory, "file", 16)
    memory.end_turn()
    assert memory.counters.evictions > 0
    rig.close()
