"""Where a reply starting beside a streaming one goes, on the real embedded model in the KV streams layout (issue 59):
llama.cpp decodes a step's replies as one ubatch only where their slots are consecutive, so a reply whose free slot
is apart from the streaming ones takes an idle neighbour's slot instead (that conversation parked, reopened without
a recompute); with nothing streaming, a free slot in the longest free run goes first, and with every slot held the
idle neighbour of the slot placed last, where that was placed just before (requests arriving together)."""

from __future__ import annotations

import threading

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.conversations import lifecycle


def engine_with(tmp_path, slots: int) -> Engine:
    return Engine(Settings(home=str(tmp_path), budget_tokens=1024, n_ctx=4096, slots=slots,
                           parallel_replies=slots - 1, embedder="off"), prewarm=False)


def three_in_slots(engine: Engine) -> list:
    """Three conversations with a turn each, in slots 0, 1 and 2 (the longest free run, then the one beside it)."""
    convs = [engine.new_conversation() for _ in range(3)]
    for conv in convs:
        conv.submit("Hi.", max_tokens=2, temperature=0).result()
    assert [engine.lifecycle.model.slots.slot_of(conv.id) for conv in convs] == [0, 1, 2]
    return convs


def test_a_reply_beside_a_streaming_one_takes_an_idle_neighbours_slot(tmp_path):
    with engine_with(tmp_path, slots=4) as engine:
        slots = engine.lifecycle.model.slots
        idle = three_in_slots(engine)
        assert engine.release_soon(idle[0].id).result() is True                  # slot 0 free, apart from 3
        streaming, started = engine.new_conversation(), threading.Event()
        reply = streaming.submit("Write a long story about a lighthouse keeper.", max_tokens=96, temperature=0,
                                 on_token=lambda _piece: started.set())
        assert started.wait(60) and slots.slot_of(streaming.id) == 3
        beside = engine.new_conversation()
        beside.submit("List five fruits.", max_tokens=4, temperature=0).result()
        assert not reply.done()                                          # it started while the story streamed
        assert slots.slot_of(beside.id) == 2 and slots.slot_of(idle[2].id) is None     # the neighbour parked
        reply.result()
        assert idle[2].submit("And again?", max_tokens=2, temperature=0).result().text is not None   # reopens
        for conv in (idle[1], idle[2], streaming, beside):
            conv.check()


@pytest.mark.parametrize("together_s, parked", [(60.0, 1), (0.0, 0)])
def test_with_every_slot_held_a_conversation_opened_together_goes_next_to_the_last_placed(tmp_path, monkeypatch,
                                                                                           together_s, parked):
    """Requests arriving together take the idle neighbour of the slot placed last (they will stream together); at
    a user's pace (the last placement older than `OPENED_TOGETHER_S`) the least recently used conversation goes."""
    monkeypatch.setattr(lifecycle, "OPENED_TOGETHER_S", together_s)
    with engine_with(tmp_path, slots=3) as engine:
        slots = engine.lifecycle.model.slots
        held = three_in_slots(engine)
        held[1].submit("Again.", max_tokens=2, temperature=0).result()     # least recent now: 0, then 2, then 1
        newcomer = engine.new_conversation()
        newcomer.submit("Hello.", max_tokens=2, temperature=0).result()
        assert slots.slot_of(newcomer.id) == parked and slots.slot_of(held[parked].id) is None
        for conv in (*held, newcomer):
            conv.check()
