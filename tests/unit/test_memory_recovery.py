"""Recovery over the fake KV cache: a saved block spliced back at the tail, the pool giving its bytes back."""

from __future__ import annotations

import pytest
from helpers.rig import Rig

from evoke_engine.errors import RestoreError
from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import BlockState

pytestmark = pytest.mark.unit


def _with_saved(rig, memory, **fields):
    """A conversation whose first file block (`fields` on it) was evicted, saved in the pool."""
    first = rig.add(memory, "file", 16, priority=0.01, **fields)
    for _ in range(10):
        rig.add(memory, "file", 16, priority=0.9)
    memory.end_turn()
    assert first.state is BlockState.RAM
    return first


def test_a_restored_block_comes_back_at_the_tail_with_its_tokens(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    tail = memory.active_tokens
    decoded = rig.rt.decoded_into(memory.seq)
    memory.restore_block(block)
    assert (block.state, block.pos) == (BlockState.RESIDENT, tail)
    assert rig.kv.layout(memory.seq)[-16:] == [(tail + i, t) for i, t in enumerate(block.tokens)]
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    assert rig.rt.decoded_into(memory.seq) == decoded               # no forward pass
    memory.check()


def test_the_pool_gives_the_bytes_back(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    held = rig.pool.ram_bytes
    memory.restore_block(block)
    assert block not in rig.pool and rig.pool.ram_bytes == held - rig.kv.save(memory.seq, block.pos, block.end).nbytes
    assert (memory.counters.recoveries, memory.counters.recovered_tokens, block.recoveries) == (1, 16, 1)


def test_a_refused_restore_leaves_the_block_saved(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    layout = rig.kv.layout(memory.seq)
    rig.kv.reject_restores = 1
    with pytest.raises(RestoreError):
        memory.restore_block(block)
    assert block in rig.pool and block.state is BlockState.RAM and block.pos is None
    assert rig.kv.layout(memory.seq) == layout
    memory.restore_block(block)                                     # and it still comes back later
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)


def test_a_block_evicted_again_after_a_recovery_keeps_its_tokens(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    memory.restore_block(block)
    block.priority = 0.001
    memory.turn = 5
    for _ in range(4):
        rig.add(memory, "file", 16, priority=0.9, turn=5)
    memory.end_turn()
    assert block.state is BlockState.RAM
    memory.restore_block(block)
    assert [t for p, t in rig.kv.layout(memory.seq)[block.pos:block.end]] == block.tokens


def test_an_identity_hit_is_recovered_before_the_message(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    recovered = memory.recover("the same file again", message_tokens=16, reply_reserve=16,
                               identity_hashes={block.hash})
    assert recovered == [block] and memory.counters.identity_hits == 1
    assert any(e.kind is EventKind.RECOVERED and e.block == block.name for e in rig.events)
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)


def test_a_file_named_in_the_message_is_recovered(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory, file_name="src/config.py")
    assert memory.recover("what does src/config.py set?", message_tokens=8, reply_reserve=8) == [block]
    assert memory.decisions[-1]["reason"] == "named"


def test_an_unrelated_message_recovers_nothing(rig):
    memory = rig.memory()
    _with_saved(rig, memory, file_name="src/config.py")
    assert memory.recover("hello there", message_tokens=8, reply_reserve=8) == []


def test_recovery_never_plans_past_the_room(rig):
    memory = rig.memory()
    block = _with_saved(rig, memory)
    assert memory.recover("again", message_tokens=150, reply_reserve=40, identity_hashes={block.hash}) == []
    assert block.state is BlockState.RAM


def test_a_spilled_block_comes_back_from_disk(tmp_path):
    rig = Rig(tmp_path, ram_budget_bytes=0)
    memory = rig.memory()
    first = rig.add(memory, "file", 16, priority=0.01)
    for _ in range(10):
        rig.add(memory, "file", 16, priority=0.9)
    assert first.state is BlockState.DISK and rig.pool.ram_bytes == 0
    memory.restore_block(first)
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    rig.close()


def test_breadcrumb_recovery_decodes_a_marker_of_the_dropped_text(tmp_path):
    rig = Rig(tmp_path, recovery="breadcrumb")
    memory = rig.memory()
    first = rig.add(memory, "file", 16, priority=0.01, file_name="notes.txt")
    for _ in range(10):
        rig.add(memory, "file", 16, priority=0.9)
    memory.end_turn()
    assert first.state is BlockState.DROPPED and rig.pool.ram_bytes == 0
    (crumb,) = memory.recover("what is in notes.txt?", message_tokens=8, reply_reserve=8)
    assert crumb.name == f"breadcrumb:{first.name}" and crumb.text.startswith(f"[earlier {first.name}:")
    assert crumb is memory.table.resident[-1]
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    rig.close()
