"""Parking, forking and removing blocks over the fake KV cache."""

from __future__ import annotations

import pytest

from evoke_engine.errors import RestoreError
from evoke_engine.kvcache.blocks import BlockState

pytestmark = pytest.mark.unit


def _chat(rig, memory, n=4):
    return [rig.add(memory, role, 16) for role in ("user", "assistant", "file", "assistant")[:n]]


def test_park_saves_the_slot_and_unpark_restores_it_in_another_slot(rig):
    memory = rig.memory(seq=0)
    _chat(rig, memory)
    layout = rig.kv.layout(0)
    memory.park()
    assert memory.seq is None and rig.kv.layout(0) == [] and memory.memory_location() == "ram"
    rig.enter_slot(memory, 2)
    assert rig.kv.layout(2) == layout and memory.image is None
    memory.check()


def test_the_opening_held_ahead_survives_parking(rig):
    memory = rig.memory()
    _chat(rig, memory)
    opening = rig.tokens_for(3, "opening")
    rig.rt.decode(opening, memory.seq, memory.active_tokens, logits_last=False)
    rig.kv.hold_ahead(memory.seq, memory.active_tokens, opening)
    memory.park()
    rig.enter_slot(memory, 1)
    assert rig.kv.held_ahead(1) == opening
    memory.check()
    user = rig.block("user", 5, turn=2)
    user.tokens[:0] = opening                                  # the next message starts with the opening
    before = rig.rt.decoded_into(1)
    memory.append_decoded(user)
    assert rig.rt.decoded_into(1) - before == 5 and rig.kv.ahead_claimed == 3


def test_a_conversation_of_only_its_prefix_parks_without_an_image(rig):
    memory = rig.memory()
    memory.park()
    assert memory.image is None and memory.memory_location() == "none"
    rig.enter_slot(memory, 3)
    assert rig.kv.layout(3) == rig.expected_layout(memory)


def test_a_lost_image_is_a_restore_error(rig):
    memory = rig.memory()
    _chat(rig, memory)
    memory.park()
    rig.pool.discard(memory.image)
    with pytest.raises(RestoreError):
        rig.enter_slot(memory, 1)


def test_parking_twice_is_refused(rig):
    from evoke_engine.errors import InvariantError

    memory = rig.memory()
    memory.park()
    with pytest.raises(InvariantError):
        memory.park()


def test_release_frees_the_slot_and_the_pool(rig):
    memory = rig.memory()
    for _ in range(11):
        rig.add(memory, "file", 16)
    assert rig.pool.ram_bytes > 0
    memory.release()
    assert rig.pool.ram_bytes == 0 and rig.kv.layout(0) == [] and memory.seq is None


def test_a_fork_shares_the_parents_cells_without_a_decode(rig):
    parent = rig.memory("parent", seq=0)
    _chat(rig, parent)
    child = rig.memory("child", seq=1)
    decoded = rig.rt.decoded_into(1)
    parent.share_into(child)
    assert rig.kv.layout(1) == rig.kv.layout(0) == rig.expected_layout(child)
    assert rig.rt.decoded_into(1) == decoded
    assert all(b.sibling_shared for b in parent.table.resident if not b.shared)
    child.check()


def test_evicting_in_the_parent_leaves_the_forks_cells_where_they_were(rig):
    parent = rig.memory("parent", seq=0)
    for p in [0.9, 0.1, 0.9, 0.1, 0.9, 0.9]:
        rig.add(parent, "file", 16, priority=p)
    child = rig.memory("child", seq=1)
    parent.share_into(child)
    child_layout = rig.kv.layout(1)
    for _ in range(5):
        rig.add(parent, "file", 16, priority=0.9)
    assert parent.counters.evictions > 0
    assert rig.kv.layout(1) == child_layout == rig.expected_layout(child)
    assert rig.kv.layout(0) == rig.expected_layout(parent)
    parent.check()
    child.check()


def test_saved_blocks_are_shared_with_a_fork_and_each_can_restore_them(rig):
    parent = rig.memory("parent", seq=0)
    first = rig.add(parent, "file", 16, priority=0.01)
    for _ in range(10):
        rig.add(parent, "file", 16, priority=0.9)
    assert first.state is BlockState.RAM
    child = rig.memory("child", seq=1)
    parent.share_into(child)
    copy = child.table.by_name(first.name)
    assert copy in rig.pool and copy.state is BlockState.RAM
    child.restore_block(copy)
    parent.restore_block(first)
    assert [t for _, t in rig.kv.layout(1)[copy.pos:copy.end]] == first.tokens
    assert [t for _, t in rig.kv.layout(0)[first.pos:first.end]] == first.tokens


def test_removing_a_middle_block_moves_the_later_ones_down(rig):
    memory = rig.memory()
    blocks = _chat(rig, memory)
    memory.remove_blocks([blocks[1]])
    assert blocks[1] not in memory.table.blocks
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    assert blocks[2].pos == rig.prefix_tokens + 16
    memory.check()


def test_removing_the_tail_drops_without_moving_a_cell(rig):
    memory = rig.memory()
    blocks = _chat(rig, memory)
    kept = rig.kv.layout(memory.seq)[:blocks[2].pos]
    memory.remove_blocks(blocks[2:])
    assert rig.kv.layout(memory.seq) == kept and not rig.kv.shift_pending


def test_removing_a_saved_block_frees_its_bytes(rig):
    memory = rig.memory()
    first = rig.add(memory, "file", 16, priority=0.01)
    for _ in range(10):
        rig.add(memory, "file", 16, priority=0.9)
    held = rig.pool.ram_bytes
    memory.remove_blocks([first])
    assert first not in rig.pool and rig.pool.ram_bytes < held and first not in memory.table.blocks


def test_the_shared_prefix_cannot_be_removed(rig):
    memory = rig.memory()
    with pytest.raises(ValueError, match="prefix"):
        memory.remove_blocks([memory.table.blocks[0]])
