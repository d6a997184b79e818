"""Recover wider, keep what is used (`recovery_overdraft_tokens`): a turn brings back its working set past the room,
runs over the budget by at most the overdraft, and its end evicts back under the budget, worst-ranked first."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.axis_embedder import AxisEmbedder
from helpers.axis_embedder import at_cosine as _vector
from helpers.rig import Rig

from evoke_engine.kvcache.blocks import BlockState

pytestmark = pytest.mark.unit


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path, recall_signal="block", recovery_top_k=4, recovery_margin=1.0)
    yield rig
    rig.close()


def _conversation(rig, overdraft: int):
    """Six saved file blocks (cosines 0.9 .. 0.4 with any message) and the rest (cosine 0.1), half of it saved."""
    settings = dataclasses.replace(rig.settings, recovery_overdraft_tokens=overdraft)
    memory = rig.memory(settings=settings)
    saved = [rig.add(memory, "file", 16, priority=0.01) for _ in range(6)]
    for _ in range(12):
        rig.add(memory, "file", 16, priority=0.9)
    memory.end_turn()
    assert all(b.state is BlockState.RAM for b in saved)
    memory.embedder = AxisEmbedder()
    for block in memory.table.blocks:
        block.embedding = None if block.shared else _vector(0.1)
    for block, cosine in zip(saved, (0.9, 0.8, 0.7, 0.6, 0.5, 0.4), strict=True):
        block.embedding = _vector(cosine)
    memory.turn += 1
    memory.set_query("where is it?")
    return memory, saved


def _turn(rig, memory, recovered, reply: str = "", reply_tokens: int = 16):
    """The message and a reply decoded (within the turn's limit), then the turn's end."""
    current = [*recovered, *memory.turn_protected]
    rig.add(memory, "user", 16, current=current, turn=memory.turn)
    rig.add(memory, "assistant", reply_tokens, current=current, turn=memory.turn)
    assert memory.active_tokens <= memory.turn_limit_tokens
    memory.end_turn(keep=[b for b in recovered if b.state is BlockState.RESIDENT], reply=reply)


def test_without_an_overdraft_a_recovery_brings_back_only_what_fits_the_room(rig):
    memory, saved = _conversation(rig, overdraft=0)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:2] and memory.overdraft == 0          # room: 184 - 16 - 120 - 16 = 32 tokens


def test_a_wide_recovery_brings_back_its_working_set_past_the_room_and_says_so(rig):
    memory, saved = _conversation(rig, overdraft=48)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:4]
    assert memory.overdraft == 32 and memory.turn_limit_tokens == memory.budget_tokens + 32
    decisions = {d["block"]: d for d in memory.decisions}
    assert [decisions[b.name].get("past_room", False) for b in recovered] == [False, False, True, True]


def test_the_overdraft_caps_how_wide_a_turn_recovers(rig):
    memory, saved = _conversation(rig, overdraft=16)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:3] and memory.overdraft == 16


def test_the_turn_end_holds_the_budget_and_keeps_the_best_ranked_recoveries(rig):
    memory, saved = _conversation(rig, overdraft=48)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    _turn(rig, memory, recovered)
    assert memory.overdraft == 0 and memory.turn_limit_tokens == memory.budget_tokens
    assert memory.active_tokens <= memory.budget_tokens
    assert memory.counters.max_active_at_turn_end <= memory.budget_tokens
    kept = [b.state is BlockState.RESIDENT for b in recovered]
    assert kept == sorted(kept, reverse=True) and kept[0]           # the worst ranked left first
    decisions = {d["block"]: d for d in memory.decisions}
    assert [decisions[b.name]["kept_at_turn_end"] for b in recovered] == kept
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    memory.check()


def test_the_reply_context_is_what_was_resident_as_the_reply_started_not_after_the_turn(rig):
    memory, saved = _conversation(rig, overdraft=48)
    _quotable(saved)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    current = [*recovered, *memory.turn_protected]
    rig.add(memory, "user", 16, current=current, turn=memory.turn)
    memory.reply_starts()
    assert set(memory.reply_context) == {b.name for b in memory.table.resident if not b.shared}
    assert {b.name for b in recovered} <= set(memory.reply_context)
    rig.add(memory, "assistant", 16, current=current, turn=memory.turn)
    memory.end_turn(keep=[b for b in recovered if b.state is BlockState.RESIDENT], reply="It is 4099.")
    left = [b for b in recovered if b.state is not BlockState.RESIDENT]
    assert left and all(b.name in memory.stats().reply_context for b in left)    # read before the turn end let go
    assert memory.stats().as_dict()["reply_context"] == list(memory.reply_context)


def _quotable(saved):
    for i, block in enumerate(saved):
        block.text = f"upload_chunk_bytes_{i} = {4096 + i}"            # what a reply can quote


def test_the_turn_end_keeps_what_the_reply_used_and_lets_the_other_recoveries_go(rig):
    memory, saved = _conversation(rig, overdraft=48)
    _quotable(saved)
    events = []
    memory.emit = events.append
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:4]
    _turn(rig, memory, recovered, reply="It is 4099.")
    assert [b.state for b in recovered] == [BlockState.RAM] * 3 + [BlockState.RESIDENT]   # the used one, ranked last
    decisions = {d["block"]: d for d in memory.decisions}
    assert [decisions[b.name]["reply_used"] for b in recovered] == [0, 0, 0, 1]
    assert [decisions[b.name]["kept_at_turn_end"] for b in recovered] == [False, False, False, True]
    assert {e.block for e in events if "the reply did not use it" in e.message} == {b.name for b in saved[:3]}
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    memory.check()


def test_a_reply_that_quotes_no_block_of_its_own_lets_no_recovery_go(rig):
    memory, saved = _conversation(rig, overdraft=48)
    _quotable(saved)
    question = "where is upload_chunk_bytes_2?"
    memory.set_query(question)
    recovered = memory.recover(question, message_tokens=120, reply_reserve=16)
    _turn(rig, memory, recovered, reply="Sure: upload_chunk_bytes_2 is one of the upload chunk settings.")
    decisions = {d["block"]: d for d in memory.decisions}
    assert all(decisions[b.name]["reply_used"] == 0 for b in recovered)   # it echoes the question, or common words
    assert recovered[0].state is BlockState.RESIDENT                   # the budget's order alone, as before


def test_when_the_budget_needs_room_the_used_recovery_stays_before_better_ranked_ones(rig):
    memory, saved = _conversation(rig, overdraft=48)
    memory.settings = dataclasses.replace(memory.settings, recovery_keep_used=False)
    _quotable(saved)
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    for block in memory.table.resident:
        block.pinned = block.pinned or block.role == "file" and block not in recovered   # the room must come from them
    _turn(rig, memory, recovered, reply="It is 4099.")
    assert saved[3].state is BlockState.RESIDENT                       # ranked last of four, but the reply used it
    assert any(b.state is not BlockState.RESIDENT for b in saved[:3]) and memory.active_tokens <= memory.budget_tokens
    memory.check()


def test_a_resident_block_that_ranks_in_the_working_set_is_not_pushed_out_by_a_recovery(rig):
    memory, saved = _conversation(rig, overdraft=48)
    resident = [b for b in memory.table.resident if not b.shared and b.role == "file"]
    star = resident[0]
    star.embedding = _vector(0.85)                                   # ranks second: it stays, three saved come back
    star.priority = 0.001                                            # the eviction scorer alone would drop it first
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:3] and memory.turn_protected == [star]
    _turn(rig, memory, recovered)
    assert star.state is BlockState.RESIDENT and memory.active_tokens <= memory.budget_tokens


def test_the_replys_room_check_keeps_a_working_set_whose_resident_blocks_took_room(rig):
    """The working set's resident blocks stay through the turn, so the picks share the room with them: the reply's
    room check never has to evict one of them. Before, three such blocks (48 tokens) took the turn past its limit, and
    that check evicted by score past the working set (in a 14-turn session: the block with the passkey)."""
    memory, saved = _conversation(rig, overdraft=48)
    stars = [b for b in memory.table.resident if not b.shared and b.role == "file"][:3]
    for star, cosine in zip(stars, (0.87, 0.86, 0.85), strict=True):
        star.embedding = _vector(cosine)                             # rank 2-4: the working set keeps them
        star.priority = 0.001                                        # the eviction scorer alone would drop them first
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == saved[:1] and memory.turn_protected == stars
    current = [*recovered, *memory.turn_protected]
    rig.add(memory, "user", 120, current=current, turn=memory.turn)
    question = memory.table.blocks[-1]
    reply = rig.add(memory, "assistant", 1, current=[*current, question], turn=memory.turn)
    assert memory.make_reply_room(current, [question], reply)                     # the reply's first room check
    assert memory.active_tokens + 15 <= memory.turn_limit_tokens                  # its reserve fits
    assert all(b.state is BlockState.RESIDENT for b in [*stars, *recovered])
    memory.check()


def test_a_reply_past_its_reserve_lets_the_working_set_go_lowest_ranked_first(rig):
    """When only this turn's blocks are left to evict, the reply's room check lets them go one at a time, the
    worst-ranked first (as a turn end does), not by the eviction score: that would drop the best-ranked block here."""
    memory, saved = _conversation(rig, overdraft=48)
    stars = [b for b in memory.table.resident if not b.shared and b.role == "file"][:3]
    for star, cosine, priority in zip(stars, (0.87, 0.86, 0.85), (0.0001, 0.001, 0.01), strict=True):
        star.embedding = _vector(cosine)                             # rank 2-4: the working set keeps them
        star.priority = priority                                     # the scorer alone would drop the best first
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    current = [*recovered, *memory.turn_protected]
    assert memory.turn_protected == stars
    question = rig.add(memory, "user", 120, current=current, turn=memory.turn)
    reply = rig.add(memory, "assistant", 1, current=[*current, question], turn=memory.turn)
    for block in memory.table.resident:
        block.pinned = block.pinned or block not in [*current, question, reply]   # the room must come from them
    room = memory.turn_limit_tokens - memory.active_tokens + 1                    # one token past the limit
    assert memory.make_reply_room(current, [question], reply, room=room)
    assert [b.state is BlockState.RESIDENT for b in stars] == [True, True, False]
    assert all(b.state is BlockState.RESIDENT for b in [*recovered, question, reply])
    memory.check()


def test_the_best_match_resident_deep_in_the_context_moves_next_to_the_message(rig):
    memory, saved = _conversation(rig, overdraft=48)
    events = []
    memory.emit = events.append
    star = [b for b in memory.table.resident if not b.shared and b.role == "file"][0]
    star.embedding = _vector(0.95)                                   # the best match, far from the tail
    old_pos = star.pos
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16)
    assert recovered == [star, *saved[:3]] and star not in memory.turn_protected
    assert star.state is BlockState.RESIDENT and star.pos > old_pos
    assert any(e.block == star.name and "moved next to it" in e.message for e in events)
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    memory.check()


def test_the_best_match_stays_in_place_when_it_would_not_fit_the_turns_room(rig):
    memory, saved = _conversation(rig, overdraft=0)
    memory.settings = dataclasses.replace(memory.settings, recovery_overdraft_tokens=8)
    star = [b for b in memory.table.resident if not b.shared and b.role == "file"][0]
    star.embedding = _vector(0.95)
    position = star.pos
    recovered = memory.recover("where is it?", message_tokens=184, reply_reserve=16)   # no room, 8 past it
    assert star.n_tokens > 8 and star not in recovered
    assert star.state is BlockState.RESIDENT and star.pos == position
    memory.check()


def test_a_named_file_and_the_used_block_both_stay(rig):
    memory, saved = _conversation(rig, overdraft=48)
    _quotable(saved)
    saved[0].file_name = "limits.py"
    question = "what is in limits.py?"
    memory.set_query(question)
    recovered = memory.recover(question, message_tokens=120, reply_reserve=16)
    decisions = {d["block"]: d for d in memory.decisions}
    assert decisions[saved[0].name]["reason"] == "named" and saved[3] in recovered
    _turn(rig, memory, recovered, reply="It is 4099.")
    assert saved[0].state is BlockState.RESIDENT and saved[3].state is BlockState.RESIDENT   # asked for; used
    assert all(b.state is BlockState.RAM for b in recovered if b not in (saved[0], saved[3]))
    memory.check()


def test_without_a_signal_to_rank_by_there_is_no_working_set_and_no_overdraft(rig):
    memory, saved = _conversation(rig, overdraft=48)
    memory.embedder = rig.embedder                                   # off: only identity and named hits
    recovered = memory.recover("where is it?", message_tokens=120, reply_reserve=16, identity_hashes={saved[5].hash})
    assert recovered == [saved[5]] and memory.overdraft == 0 and memory.turn_protected == []
