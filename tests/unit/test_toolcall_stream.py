"""Issue 60, tool calls streamed: each format's replies (the markup the real templates render, markers kept and
dropped as the engine's text drops control tokens) read piece by piece, split at every character boundary, give
the calls, ids and content of the whole reply read at once; arguments pieces join to its arguments string."""

from __future__ import annotations

import itertools
import json

import pytest

from evoke_engine.server.app import openai_delta
from evoke_engine.server.toolcall_formats import FORMATS, format_named
from evoke_engine.server.toolcall_stream import CallReader
from evoke_engine.server.toolcalls import parse_tool_calls, read_reply

from .test_issue60_toolcall_formats import CONTROL_TOKENS, FAMILIES, PROSE, REPLIES, TOOL_NAMES, rendered_reply

pytestmark = pytest.mark.unit


def numbered_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def streamed(pieces: list[str], fmt, forced: bool = False) -> tuple[list[dict], CallReader]:
    """The OpenAI deltas a stream sends for `pieces`, and its reader (closed)."""
    reader = CallReader(fmt, TOOL_NAMES, forced=forced, new_id=numbered_ids())
    deltas = [d for piece in pieces for d in reader.feed(piece)] + reader.close()
    return [openai_delta(d) for d in deltas], reader


def accumulate(deltas: list[dict]) -> tuple[str, list[dict]]:
    """What an OpenAI client builds from the deltas (openai-python's accumulation: by index, arguments appended)."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            slot = calls.setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
            assert call.get("id") is None or slot["id"] is None, "a call's id is sent once, in its first chunk"
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] = call.get("function", {}).get("name") or slot["name"]
            slot["arguments"] += call.get("function", {}).get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]


def splits(text: str):
    yield [text]
    yield list(text)                                           # every character alone
    for at in range(1, len(text)):                             # two pieces, cut at every boundary
        yield [text[:at], text[at:]]


def replies():
    for name, cases in REPLIES.items():
        for reply, _, _ in cases:
            yield name, reply
    for fixture, name, bos, eos, end in FAMILIES:
        reply = rendered_reply(fixture, bos, eos, end)
        yield name, reply
        for token in CONTROL_TOKENS:
            reply = reply.replace(token, "")
        yield name, reply


@pytest.mark.parametrize(("name", "reply"), list(replies()))
def test_every_split_streams_the_calls_of_the_whole_reply(name, reply):
    fmt = format_named(name)
    whole = read_reply(reply, TOOL_NAMES, fmt)
    assert whole.finished_calls(), reply
    expected = [(c.name, c.arguments) for c in whole.finished_calls()]
    for pieces in splits(reply):
        deltas, reader = streamed(pieces, fmt)
        content, calls = accumulate(deltas)
        assert [(c["name"], c["arguments"]) for c in calls] == expected
        assert [c["id"] for c in calls] == [c.call_id for c in reader.finished_calls()]
        assert all(isinstance(json.loads(c["arguments"]), dict) for c in calls)
        assert (content.strip() or None) == whole.content == reader.content
        assert not any(m in content for m in (*fmt.markers, "{", "[ARGS]"))


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("text", PROSE)
def test_prose_streams_as_content_in_every_split(name, text):
    for pieces in splits(text):
        content, calls = accumulate(streamed(pieces, format_named(name))[0])
        assert (content, calls) == (text, [])


def test_an_undeclared_tool_is_never_streamed_as_a_call():
    reply = '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>'
    for pieces in splits(reply):
        content, calls = accumulate(streamed(pieces, format_named("hermes"))[0])
        assert (content, calls) == (reply, [])


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Pa'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci'),
    ("mistral_args", 'grep{"pattern": "TODO"}get_weather{"city": "Pa')])
def test_a_call_cut_short_is_left_out_of_the_finished_reply(name, text):
    """What a streaming client sees of a cut call: its opening and the arguments written, then `length` (the
    endpoint's finish_reason from `unfinished`); the finished reply, streamed or not, leaves it out."""
    fmt = format_named(name)
    whole = read_reply(text, TOOL_NAMES, fmt)
    assert whole.unfinished and not any(c.name == "get_weather" for c in whole.finished_calls())
    for pieces in splits(text):
        deltas, reader = streamed(pieces, fmt)
        assert reader.unfinished
        assert [c.name for c in reader.finished_calls()] == [c.name for c in whole.finished_calls()]
        assert accumulate(deltas)[0].strip() == ""


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_forced_call_streams_no_content(name):
    fmt = format_named(name)
    reply = next(r for r, content, _ in REPLIES[name] if content is None)
    for pieces in splits(reply):
        content, calls = accumulate(streamed(pieces, fmt, forced=True)[0])
        assert content == "" and [c["name"] for c in calls] == [c.name for c in
                                                               parse_tool_calls(reply, TOOL_NAMES, fmt)[1]]
    deltas, reader = streamed(['<tool_call>\n{"name": "gre'], fmt, forced=True)
    assert reader.unfinished and accumulate(deltas) == ("", [])


def test_arguments_stream_as_they_are_written():
    reply = '<tool_call>\n{"name": "grep", "arguments": {"pattern": "a long pattern"}}\n</tool_call>'
    deltas, _ = streamed(list(reply), format_named("hermes"))
    pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
    assert deltas[0]["tool_calls"][0] == {"index": 0, "id": "call_0", "type": "function",
                                          "function": {"name": "grep", "arguments": ""}}
    assert len(pieces) > 10 and "".join(pieces) == '{"pattern": "a long pattern"}'
