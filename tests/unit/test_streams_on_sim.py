"""Replies of several conversations stream together on a whole Engine (issue 59), on the simulated backend: the
second conversation's first token comes before the first's reply ends, both replies are whole and each slot holds
exactly its rendered history; a conversation whose reply streams keeps its slot while others come and go; a job
about a streaming conversation waits for the reply; `wait_idle` waits for every reply."""

from __future__ import annotations

import threading

import pytest
from helpers.sim_backend import SimBackend, conversation_text, rendered, sim_engine, sim_settings

from evoke_engine.worker import Command

pytestmark = pytest.mark.unit

LONG = " ".join(f"word{i}" for i in range(40)) + "."


@pytest.fixture
def backend(tmp_path):
    return SimBackend(tmp_path / "sim.gguf")


def held(engine) -> threading.Event:
    """Occupy the engine thread until the returned event is set: what is submitted meanwhile starts together."""
    gate, started = threading.Event(), threading.Event()
    engine.thread.submit(lambda: (started.set(), gate.wait(10)), command=Command.READ)
    started.wait(10)
    return gate


def test_two_conversations_stream_their_replies_together(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path, slots=3, parallel_replies=2)) as (engine, _):
        a, b = engine.new_conversation(), engine.new_conversation()
        backend.script(LONG, "short answer.")
        heard: list[tuple[str, set[str]]] = []          # (whose token, the conversations streaming as it came)

        def hear(name: str):
            return lambda _piece: heard.append((name, engine.thread.streaming_conversations()))
        gate = held(engine)
        first = a.submit("tell me a long story", on_token=hear("a"))
        second = b.submit("a quick question", on_token=hear("b"))
        gate.set()
        texts = {"a": first.result(30).text, "b": second.result(30).text}     # scripted replies go in the order
        assert sorted(texts.values()) == sorted([LONG, "short answer."])      # the replies start sampling
        assert any(streaming == {a.id, b.id} for _, streaming in heard)      # written together, not in turn
        engine.wait_idle()
        for conv in (a, b):
            assert conversation_text(engine, conv.id) == rendered(engine, conv.id)
            engine.check(conv.id)


def test_replies_in_one_context_for_all_slots_stream_together_too(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path, slots=3, slot_layout="unified")) as (engine, _):
        a, b = engine.new_conversation(), engine.new_conversation()
        backend.script(LONG, "short answer.")
        heard: list[str] = []
        gate = held(engine)
        first = a.submit("tell me a long story", on_token=lambda piece: heard.append("a"))
        second = b.submit("a quick question", on_token=lambda piece: heard.append("b"))
        gate.set()
        first.result(30), second.result(30)
        assert heard != sorted(heard)                        # interleaved (llama.cpp's runtime shares the steps)


def test_one_reply_at_a_time_with_the_attention_capture(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path, slots=3, attention_capture=True)) as (engine, _):
        a, b = engine.new_conversation(), engine.new_conversation()
        backend.script(LONG, "short answer.")
        heard: list[str] = []
        gate = held(engine)
        first = a.submit("tell me a long story", on_token=lambda piece: heard.append("a"))
        second = b.submit("a quick question", on_token=lambda piece: heard.append("b"))
        gate.set()
        first.result(30), second.result(30)
        assert heard == sorted(heard)                        # every "a" before every "b"


def test_a_streaming_conversation_keeps_its_slot_while_others_open(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path, slots=2)) as (engine, _):
        a = engine.new_conversation()
        others = [engine.new_conversation() for _ in range(3)]
        backend.script(LONG)
        parked_while_streaming: list[str] = []
        opened_while_streaming: list[str] = []

        def on_event(event) -> None:          # engine thread
            if event.kind.name == "PARKED" and a.id in {j.conversation_id for j in engine.thread.streaming()}:
                parked_while_streaming.append(event.conversation_id)

        def open_into_a_slot(conversation_id: str) -> None:
            if engine.thread.streaming():
                opened_while_streaming.append(conversation_id)
            engine.lifecycle.ensure_slot(engine.lifecycle.open(conversation_id))
        engine.subscribe(on_event)
        gate = held(engine)
        streaming = a.submit("tell me a long story")
        opened = [engine.thread.submit(open_into_a_slot, c.id, command=Command.OPEN, about=c.id) for c in others]
        gate.set()
        assert streaming.result(30).text == LONG
        for future in opened:
            future.result(30)
        assert len(opened_while_streaming) == 3 and len(parked_while_streaming) >= 2   # the other slot changed hands
        assert a.id not in parked_while_streaming                                     # never the streaming one
        assert [m["text"] for m in a.messages()] == ["tell me a long story", LONG]
        engine.wait_idle()
        engine.check(a.id)


def test_an_edit_waits_for_the_reply_of_its_conversation(backend, tmp_path):
    with sim_engine(backend, sim_settings(tmp_path, slots=3, parallel_replies=2)) as (engine, _):
        a = engine.new_conversation()
        backend.script(LONG)
        order: list[str] = []
        gate = held(engine)
        reply = a.submit("tell me a long story", on_token=lambda piece: order.append("token"))
        renamed = engine.thread.submit(lambda: order.append("rename"), command=Command.WRITE, about=a.id)
        gate.set()
        reply.result(30), renamed.result(30)
        assert order[-1] == "rename" and order.count("token") > 10


def test_a_long_message_holds_no_other_conversation_behind_it(backend, tmp_path):
    """Issue 57 item 6 from the engine's side: a message of many blocks is prefilled a block a step, so a short
    turn sent after it in another conversation ends before the long one's first token."""
    with sim_engine(backend, sim_settings(tmp_path, slots=3, parallel_replies=2, budget_tokens=8192)) as (engine, _):
        a, b = engine.new_conversation(), engine.new_conversation()
        backend.script("first sampled.", "second sampled.")        # handed out in the order replies start
        order: list[str] = []
        gate = held(engine)
        long_turn = a.submit(" ".join(f"line{i}" for i in range(3000)), on_token=lambda _p: order.append("a"))
        short_turn = b.submit("a quick question", on_token=lambda _p: order.append("b"))
        short_turn.add_done_callback(lambda _f: order.append("b done"))
        gate.set()
        assert short_turn.result(30).text == "first sampled." and long_turn.result(30).text == "second sampled."
        assert long_turn.result().prefill_tokens > 2000
        assert order.index("b done") < order.index("a")               # b ended before a's first token
        engine.check(a.id), engine.check(b.id)
