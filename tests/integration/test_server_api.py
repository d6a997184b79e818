"""The endpoint through the official `openai` client on the real embedded model: JSON and SSE replies,
usage figures, session routing by header and by prefix, API conversations in the list, model reload."""

from __future__ import annotations

import httpx
import openai
import pytest
from helpers.server_fixtures import client_for, running_server

Q1 = "What is the capital of France? Answer in one word."


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("api")) as (engine, server):
        yield engine, server, client_for(server)


def ask(client, messages, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="evoke", messages=messages, **kw)


def evoke(reply) -> dict:
    return reply.model_extra["evoke"]


def test_models_and_health(served):
    engine, server, client = served
    ids = [m.id for m in client.models.list().data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]
    health = httpx.get(server.address.removesuffix("/v1") + "/health", timeout=30).json()
    assert health == {"status": "ok", "model_loaded": True}


def test_non_streaming_reply_and_usage(served):
    _, _, client = served
    reply = ask(client, [{"role": "user", "content": Q1}], extra_headers={"X-Evoke-Session": "t-json"})
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    figures = evoke(reply)
    assert set(figures) >= {"active", "budget", "cached", "decoded", "evictions", "recoveries"}
    assert figures["budget"] == 512 and figures["decoded"] > 0
    assert reply.usage.prompt_tokens == figures["cached"] + figures["decoded"]
    assert reply.usage.completion_tokens > 0


def test_streaming_matches_and_ends(served):
    engine, _, client = served
    stream = ask(client, [{"role": "user", "content": Q1}], stream=True, stream_options={"include_usage": True},
                 extra_headers={"X-Evoke-Session": "t-stream"})
    text, finish, usage, last = "", None, None, None
    for chunk in stream:                       # the client stops at `data: [DONE]`
        if chunk.usage is not None:
            usage, last = chunk.usage, chunk
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text and finish in ("stop", "length") and usage.completion_tokens > 0
    conv_id = evoke(last)["conversation_id"]
    assert [m["text"] for m in engine.open_conversation(conv_id).messages()] == [Q1, text]


def test_session_header_continues_and_decodes_only_the_tail(served):
    engine, _, client = served
    headers = {"X-Evoke-Session": "t-continue"}
    history = [{"role": "user", "content": Q1}]
    first = ask(client, history, extra_headers=headers)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And the capital of Italy?"}]
    second = ask(client, history, extra_headers=headers)
    figures = evoke(second)
    assert figures["conversation_id"] == evoke(first)["conversation_id"]
    assert figures["route"] == "continue"
    tail = engine.diagnostics().template.segment([{"role": "system", "content": "x"}],
                                                 {"role": "user", "content": history[-1]["content"]})
    opening = engine.diagnostics().template.assistant_frame(history).opening     # the reply's generation prompt
    assert figures["decoded"] == len(engine.tokenize(tail)) + len(engine.tokenize(opening))
    other = ask(client, [{"role": "user", "content": Q1}], extra_headers={"X-Evoke-Session": "t-other"})
    assert evoke(other)["conversation_id"] != figures["conversation_id"]


def test_user_field_is_a_label_not_a_routing_key(served):
    _, _, client = served
    first = ask(client, [{"role": "user", "content": Q1}], user="t-user-field")
    second = ask(client, [{"role": "user", "content": "And of Spain?"}], user="t-user-field")
    assert evoke(second)["conversation_id"] != evoke(first)["conversation_id"]
    assert evoke(second)["route"] == "new"


def test_a_session_continues_with_only_the_new_message(served):
    _, _, client = served
    headers = {"X-Evoke-Session": "t-stateful"}
    first = ask(client, [{"role": "user", "content": Q1}], extra_headers=headers)
    second = ask(client, [{"role": "user", "content": "And of Spain?"}], extra_headers=headers)
    assert evoke(second)["conversation_id"] == evoke(first)["conversation_id"]
    assert evoke(second)["route"] == "continue"


def test_prefix_routing_without_a_session(served):
    _, _, client = served
    system = ("You answer questions about geography, briefly and precisely. Name rivers, mountains, cities and "
              "countries with their usual English names, give lengths in kilometres and heights in metres, and "
              "say so when you are not sure of a figure.")
    opening = [{"role": "system", "content": system},
               {"role": "user", "content": "Name the longest river in Africa."}]
    first = ask(client, opening)
    follow = [*opening, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "How long is it?"}]
    second = ask(client, follow)
    assert evoke(second)["conversation_id"] == evoke(first)["conversation_id"]
    assert evoke(second)["route"] == "continue"
    unrelated = ask(client, [{"role": "system", "content": "You translate to German."},
                             {"role": "user", "content": "Good morning"}])
    assert evoke(unrelated)["conversation_id"] != evoke(first)["conversation_id"]


def test_api_conversations_are_marked_in_the_list(served):
    engine, _, client = served
    reply = ask(client, [{"role": "user", "content": Q1}], extra_headers={"X-Evoke-Session": "t-list"})
    info = {i.id: i for i in engine.conversations()}[evoke(reply)["conversation_id"]]
    assert info.source == "api"


def test_window_conversation_continued_by_its_id(served):
    engine, _, client = served
    conv = engine.new_conversation(tools=[])
    answer = conv.send(Q1, max_tokens=12, temperature=0)
    reply = ask(client, [{"role": "user", "content": Q1}, {"role": "assistant", "content": answer},
                         {"role": "user", "content": "Thanks. And Germany?"}],
                extra_headers={"X-Evoke-Session": conv.id})
    assert evoke(reply)["conversation_id"] == conv.id and evoke(reply)["route"] == "continue"


def test_evoke_extensions_pin_the_turn(served):
    _, _, client = served
    reply = ask(client, [{"role": "user", "content": "Remember: the build command is make dist."}],
                extra_headers={"X-Evoke-Session": "t-pin"}, extra_body={"evoke_pinned": True, "evoke_priority": 3.0,
                                                                        "evoke_task_boundary": True})
    conv_id = evoke(reply)["conversation_id"]
    engine = served[0]
    blocks = engine.open_conversation(conv_id).stats().blocks
    assert [b["pinned"] for b in blocks if b["role"] == "user"] == [True]


def test_request_after_idle_unload_reloads_the_model(served):
    engine, _, client = served
    engine.unload_model()
    assert not engine.model_loaded
    reply = ask(client, [{"role": "user", "content": Q1}], extra_headers={"X-Evoke-Session": "t-unload"})
    assert reply.choices[0].message.content and engine.model_loaded


def test_unknown_model_is_404(served):
    _, _, client = served
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"
