"""A recovery decided while the message is typed (`ConversationMemory.recover_ahead`): what fits the room comes back
before the turn, the turn that sends the same message carries out the rest of the same plan without deciding again,
and any change to what the decision read (the message, the table, the budget, the settings) makes it decide afresh."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.axis_embedder import AxisEmbedder
from helpers.axis_embedder import at_cosine as _vector
from helpers.rig import Rig

from evoke_engine.events import EventKind
from evoke_engine.kvcache.blocks import BlockState

pytestmark = pytest.mark.unit
MESSAGE = "where is it?"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path, recall_signal="block", recovery_top_k=4, recovery_margin=1.0)
    yield rig
    rig.close()


def _conversation(rig, overdraft: int = 0):
    """Six saved file blocks (cosines 0.9 .. 0.4 with any message) and twelve resident others (cosine 0.1)."""
    memory = rig.memory(settings=dataclasses.replace(rig.settings, recovery_overdraft_tokens=overdraft))
    saved = [rig.add(memory, "file", 16, priority=0.01) for _ in range(6)]
    for _ in range(12):
        rig.add(memory, "file", 16, priority=0.9)
    memory.end_turn()
    memory.embedder = AxisEmbedder()
    for block in memory.table.blocks:
        block.embedding = None if block.shared else _vector(0.1)
    for block, cosine in zip(saved, (0.9, 0.8, 0.7, 0.6, 0.5, 0.4), strict=True):
        block.embedding = _vector(cosine)
    memory.set_query(MESSAGE)
    return memory, saved


def _count_decisions(memory) -> list[str]:
    decided: list[str] = []
    plan = memory.plan_recovery

    def counted(message, *args, **kwargs):
        decided.append(message)
        return plan(message, *args, **kwargs)
    memory.plan_recovery = counted
    return decided


def test_what_fits_the_room_comes_back_while_typing_and_the_turn_keeps_it_without_deciding_again(rig):
    memory, saved = _conversation(rig)
    decided = _count_decisions(memory)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    assert [b.state for b in saved[:2]] == [BlockState.RESIDENT] * 2       # room: 184 - 16 - 120 - 16 = 32 tokens
    assert all(b.state is BlockState.RAM for b in saved[2:])
    events = [e for e in memory.events if e.kind is EventKind.RECOVERED]
    assert [e.block for e in events] == [saved[0].name, saved[1].name]
    assert all(e.detail["turn"] == memory.turn + 1 for e in events)      # decided for the turn to come
    memory.begin_turn()
    recovered = memory.recover(MESSAGE, message_tokens=120, reply_reserve=16)
    assert recovered == saved[:2] and decided == [MESSAGE]                 # the same plan: one decision in all
    assert len([e for e in memory.events if e.kind is EventKind.RECOVERED]) == 2       # nothing restored twice
    memory.end_turn(keep=recovered)
    assert all(b.state is BlockState.RESIDENT for b in saved[:2])


def test_a_wide_recovery_brings_back_its_room_ahead_and_its_overdraft_only_in_the_turn(rig):
    memory, saved = _conversation(rig, overdraft=64)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    assert memory.overdraft == 0 and memory.active_tokens <= memory.budget_tokens    # no overdraft while typing
    ahead = [b for b in saved if b.state is BlockState.RESIDENT]
    assert ahead and len(ahead) < 4
    memory.begin_turn()
    recovered = memory.recover(MESSAGE, message_tokens=120, reply_reserve=16)
    assert recovered[:len(ahead)] == ahead and len(recovered) == 4              # the working set, as in a turn
    assert memory.overdraft > 0


def test_another_message_or_a_changed_table_decides_afresh(rig):
    memory, saved = _conversation(rig)
    decided = _count_decisions(memory)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    memory.begin_turn()
    memory.recover("something else entirely", message_tokens=120, reply_reserve=16)
    assert decided == [MESSAGE, "something else entirely"]

    memory, saved = _conversation(rig)
    decided = _count_decisions(memory)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    memory.pin(saved[5].name)                                              # the table changed after the decision
    memory.begin_turn()
    memory.recover(MESSAGE, message_tokens=120, reply_reserve=16)
    assert decided == [MESSAGE, MESSAGE]

    memory, saved = _conversation(rig)
    decided = _count_decisions(memory)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    memory.begin_turn()
    memory.recover(MESSAGE, message_tokens=100, reply_reserve=16)          # the sent message is not the draft's size
    assert decided == [MESSAGE, MESSAGE]


def test_a_plan_is_used_once(rig):
    memory, saved = _conversation(rig)
    decided = _count_decisions(memory)
    memory.recover_ahead(MESSAGE, message_tokens=120, reply_reserve=16)
    memory.begin_turn()
    memory.recover(MESSAGE, message_tokens=120, reply_reserve=16)
    memory.end_turn()
    memory.begin_turn()
    memory.recover(MESSAGE, message_tokens=120, reply_reserve=16)
    assert decided == [MESSAGE, MESSAGE]


def test_a_cold_message_is_embedded_early_only_where_a_decision_will_read_it(rig):
    """`expect_query`: the message's embedding starts at the turn's start when saved blocks are to be ranked; with
    nothing saved it is left for after the reply, where it would otherwise run beside the message's decode."""
    started: list[str] = []
    memory, saved = _conversation(rig)
    memory.embedder.embed_soon = started.append
    memory.expect_query(MESSAGE)
    assert started == [MESSAGE]
    fresh = rig.memory()
    rig.add(fresh, "file", 16)
    fresh.embedder = memory.embedder
    fresh.expect_query(MESSAGE)
    assert started == [MESSAGE]                          # nothing saved: nothing started
