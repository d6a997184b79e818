"""Eviction at the high watermark over the fake KV cache: order, protections, compaction, the pool."""

from __future__ import annotations

import pytest
from helpers.fake_kv import unpack
from helpers.rig import Rig

from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import BlockState

pytestmark = pytest.mark.unit


def _fill(rig, memory, priorities, n=16):
    return [rig.add(memory, "file", n, priority=p) for p in priorities]


def test_nothing_leaves_below_the_high_watermark(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.5] * 10)                     # 16 + 160 = 176 <= 184
    assert all(b.state is BlockState.RESIDENT for b in blocks) and memory.counters.evictions == 0


def test_crossing_the_high_watermark_evicts_lowest_score_first_to_the_low_one(rig):
    memory = rig.memory()
    priorities = [0.9, 0.2, 0.5, 0.1, 0.8, 0.3, 0.7, 0.4, 0.6, 0.95]
    blocks = _fill(rig, memory, priorities)
    rig.add(memory, "file", 16)                                  # 192 > 184: evict to 140 - 16
    evicted = [b for b in blocks if b.state is not BlockState.RESIDENT]
    assert sorted(b.priority for b in evicted) == [0.1, 0.2, 0.3, 0.4]       # the four lowest of the eight
    assert {e.block for e in rig.events if e.kind is EventKind.EVICTED} == {b.name for b in evicted}
    assert memory.active_tokens == 192 - 64


def test_equal_scores_evict_the_older_block_first(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.5] * 11)
    assert [b.state for b in blocks[:4]] == [BlockState.RAM] * 4
    assert all(b.state is BlockState.RESIDENT for b in blocks[4:])


def test_the_shared_prefix_and_the_recent_tail_are_never_evicted(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.9] * 8 + [0.01, 0.01])       # the two lowest are the recent tail
    rig.add(memory, "file", 16)
    assert all(b.state is BlockState.RESIDENT for b in memory.table.blocks if b.shared)
    assert blocks[-2].state is BlockState.RESIDENT and blocks[-1].state is BlockState.RESIDENT


def test_pinned_blocks_stay_whatever_their_score(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.01, 0.02, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
    memory.table.pin(blocks[0].name)
    memory.table.pin(blocks[1].name)
    rig.add(memory, "file", 16)
    assert blocks[0].state is BlockState.RESIDENT and blocks[1].state is BlockState.RESIDENT
    assert memory.counters.evictions == 4


def test_the_current_blocks_stay(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.01] * 2 + [0.9] * 8)
    rig.add(memory, "file", 16, current=blocks[:2])
    assert blocks[0].state is BlockState.RESIDENT and blocks[1].state is BlockState.RESIDENT


def test_positions_are_compacted_and_match_the_table_after_an_evict(rig):
    memory = rig.memory()
    _fill(rig, memory, [0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.9])
    rig.add(memory, "file", 16)
    memory.check()
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    assert rig.kv.positions(memory.seq) == list(range(memory.active_tokens))


def test_evicted_bytes_are_the_victims_tokens_at_their_old_positions(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.9])
    old = {b.name: b.pos for b in blocks}
    rig.add(memory, "file", 16)
    evicted = [b for b in blocks if b.state is BlockState.RAM]
    assert len(evicted) == 4
    for block in evicted:
        data, origin, n = rig.pool.peek_bytes(block)
        assert (origin, n) == (old[block.name], block.n_tokens)
        assert unpack(data) == (origin, [(origin + i, t) for i, t in enumerate(block.tokens)])


def test_the_pool_accounts_for_every_evicted_block(rig):
    memory = rig.memory()
    _fill(rig, memory, [0.5] * 11)
    saved = memory.table.saved()
    assert saved and all(b in rig.pool for b in saved)
    assert rig.pool.ram_bytes == sum(rig.pool.nbytes(b) for b in saved)
    assert memory.cached_tokens() == sum(b.n_tokens for b in saved) == memory.counters.evicted_tokens


@pytest.mark.parametrize("n_turns", [5, 20])
def test_active_tokens_never_exceed_the_budget_at_turn_end(rig, n_turns):
    memory = rig.memory()
    for turn in range(1, n_turns + 1):
        memory.turn = turn
        for role, n in (("user", 16), ("file", 16), ("file", 9), ("assistant", 16), ("assistant", 5)):
            rig.add(memory, role, n, turn=turn)
        memory.end_turn()
        assert memory.active_tokens <= memory.budget_tokens
        assert not rig.kv.shift_pending                          # end_turn pays the K-shift
        memory.check()
        assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    assert memory.counters.max_active_at_turn_end <= memory.budget_tokens


def test_end_turn_evicts_to_the_low_watermark_once_past_the_high_one(rig):
    memory = rig.memory()
    _fill(rig, memory, [0.5] * 10)
    memory.end_turn()                                             # 176 tokens, under the high watermark
    assert memory.counters.evictions == 0
    memory.adopt_settings(rig.settings, rig.settings.replace(high_watermark=0.8))   # 176 > 160: evicts to 140
    memory.end_turn()
    assert memory.active_tokens <= int(200 * 0.70)


def test_protected_blocks_over_the_budget_are_reported_never_silent(rig):
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.5] * 10)
    for block in blocks:
        memory.table.pin(block.name)
    rig.add(memory, "file", 16, pinned=True)
    rig.add(memory, "file", 16, pinned=True)
    memory.end_turn()
    assert memory.active_tokens > memory.budget_tokens
    assert any(e.kind is EventKind.ERROR and "over the budget" in e.message for e in rig.events)


def test_discard_keeps_no_bytes(tmp_path):
    rig = Rig(tmp_path, recovery="discard")
    memory = rig.memory()
    blocks = _fill(rig, memory, [0.5] * 11)
    assert [b.state for b in blocks[:4]] == [BlockState.DROPPED] * 4
    assert rig.pool.ram_bytes == 0 and rig.kv.saves == 0
    rig.close()


def test_no_eviction_grows_past_the_budget(tmp_path):
    rig = Rig(tmp_path, recovery="none")
    memory = rig.memory()
    _fill(rig, memory, [0.5] * 14)
    memory.end_turn()
    assert memory.active_tokens == 16 + 14 * 16 > memory.budget_tokens and memory.counters.evictions == 0
    rig.close()


def test_a_smaller_budget_evicts_at_once_and_a_too_small_one_is_refused(rig):
    from evoke_engine.errors import BudgetError

    memory = rig.memory()
    _fill(rig, memory, [0.5] * 10)
    with pytest.raises(BudgetError, match="smallest budget that works"):
        memory.set_budget(memory.min_budget_tokens() - 1)
    assert memory.budget_tokens == 200
    memory.set_budget(100)
    assert memory.active_tokens <= 70 and not rig.kv.shift_pending
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
