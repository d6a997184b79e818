"""Stateful sessions beyond the happy path, through the `openai` client on the real model: a rewritten
history forks (the original kept), a regenerate forks, and a tool call round trip (schema in,
`tool_calls` out, a `tool` message back, a final answer), streamed and not."""

from __future__ import annotations

import json

import pytest
from helpers.server_fixtures import client_for, running_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_SYSTEM = "You call tools. Reply with JSON only."
TOOL_ASK = 'Call get_weather with city Paris. Reply exactly: {"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("sessions")) as (engine, server):
        yield engine, server, client_for(server)


def ask(client, messages, session, **kw):
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model="evoke", messages=messages, temperature=0,
                                          extra_headers={"X-Evoke-Session": session}, **kw)


def evoke(reply) -> dict:
    return reply.model_extra["evoke"]


def test_rewritten_history_forks_and_keeps_the_original(served):
    engine, _, client = served
    history = [{"role": "user", "content": "Name a primary colour."}]
    first = ask(client, history, "t-fork")
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Name another one."}]
    second = ask(client, history, "t-fork")
    original = evoke(second)["conversation_id"]
    rewritten = [*history[:2], {"role": "user", "content": "Name a fruit instead."}]
    forked = ask(client, rewritten, "t-fork")
    figures = evoke(forked)
    assert figures["route"] == "fork" and figures["conversation_id"] != original
    tail = engine.diagnostics().template.segment([{"role": "system", "content": "x"}], rewritten[-1])
    opening = engine.diagnostics().template.assistant_frame(rewritten).opening      # the reply's generation prompt
    assert figures["decoded"] == len(engine.tokenize(tail)) + len(engine.tokenize(opening))   # the agreeing head is
                                                                                               # not re-decoded
    kept = [m["text"] for m in engine.open_conversation(original).messages()]
    assert kept[2] == "Name another one."                                # the original is untouched
    child = [m["text"] for m in engine.open_conversation(figures["conversation_id"]).messages()]
    assert child[:3] == [history[0]["content"], history[1]["content"], "Name a fruit instead."]
    again = ask(client, [*rewritten, {"role": "assistant", "content": forked.choices[0].message.content},
                         {"role": "user", "content": "And a vegetable?"}], "t-fork")
    assert evoke(again)["conversation_id"] == figures["conversation_id"] and evoke(again)["route"] == "continue"


def test_resent_history_without_the_last_reply_regenerates_on_a_fork(served):
    _, _, client = served
    history = [{"role": "user", "content": "Name a planet."}]
    first = ask(client, history, "t-regen")
    redo = ask(client, history, "t-regen")
    assert evoke(redo)["route"] == "fork" or evoke(redo)["route"] == "new"
    assert evoke(redo)["conversation_id"] != evoke(first)["conversation_id"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(served, stream):
    engine, _, client = served
    session = f"t-tools-{stream}"
    messages = [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": TOOL_ASK}]
    if stream:
        calls, finish = {}, None
        for chunk in ask(client, messages, session, tools=TOOLS, max_tokens=40, stream=True):
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                    entry["name"] += delta.function.name or ""
                    entry["arguments"] += delta.function.arguments or ""
        call = calls[0]
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
    else:
        reply = ask(client, messages, session, tools=TOOLS, max_tokens=40)
        finish = reply.choices[0].finish_reason
        tool_call = reply.choices[0].message.tool_calls[0]
        call_id, name, arguments = tool_call.id, tool_call.function.name, tool_call.function.arguments
    assert finish == "tool_calls"
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": '{"city": "Paris", "weather": "sunny, 24 C"}'}]
    final = ask(client, messages, session, tools=TOOLS, max_tokens=30)
    figures = evoke(final)
    assert figures["route"] == "continue"                   # the re-sent call matched the raw model text
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    roles = [m["role"] for m in engine.open_conversation(figures["conversation_id"]).messages()]
    assert roles == ["user", "assistant", "tool", "assistant"]


def test_client_written_history_is_rebuilt_then_continued(served):
    _, _, client = served
    history = [{"role": "user", "content": "Say the word apple."}, {"role": "assistant", "content": "apple"},
               {"role": "user", "content": "Say the word pear."}]
    first = ask(client, history, "t-fewshot")
    assert evoke(first)["route"] == "import" and evoke(first)["decoded"] > evoke(first)["cached"] // 4
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Say the word plum."}]
    second = ask(client, history, "t-fewshot")
    assert evoke(second)["route"] == "continue"
    assert evoke(second)["conversation_id"] == evoke(first)["conversation_id"]
