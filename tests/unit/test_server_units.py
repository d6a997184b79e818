"""Endpoint logic without the model: tool-call parsing and stream holdback, plans, Host and key checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evoke_engine.server.request_bodies import ChatRequest
from evoke_engine.server.security import ServerConfig, key_matches
from evoke_engine.server.sessions import Msg, canonicalize, plan
from evoke_engine.server.toolcall_stream import CallReader, Delta
from evoke_engine.server.toolcalls import RawTextMap, parse_tool_calls, read_reply

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)

TOOLS = {"read_file", "grep"}


def test_hermes_call_is_parsed_and_prose_kept():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "a.py"})]


def test_bare_json_call_of_the_documented_shape():
    content, calls = parse_tool_calls(' {"name": "grep", "arguments": {"pattern": "TODO"}} ', TOOLS)
    assert content is None and calls[0].name == "grep"


@pytest.mark.parametrize("text", [
    '{"name": "delete_everything", "arguments": {}}',              # not a declared tool
    '{"name": "grep", "arguments": "not json"}',                   # arguments not an object
    'I would call {"name": "grep", "arguments": {}} here.',        # JSON inside prose
    '<tool_call>{"name": "grep", "arguments": {</tool_call>',      # malformed
    '{"name": "grep", "arguments": {}, "why": "extra keys"}',      # not the documented shape
])
def test_text_that_only_looks_like_a_call_stays_text(text):
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_no_tools_declared_means_no_calls():
    text = '{"name": "grep", "arguments": {}}'
    assert parse_tool_calls(text, set()) == (text, [])


@given(st.text(max_size=200))
def test_parser_never_raises_and_keeps_plain_text(text):
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls or content == text


@given(st.lists(st.text(min_size=1, max_size=8), max_size=30))
def test_a_reply_streamed_in_any_pieces_reads_as_the_whole_text(pieces):
    reader = CallReader(tool_names=TOOLS)
    deltas = [d for p in pieces for d in reader.feed(p)] + reader.close()
    whole = read_reply("".join(pieces), TOOLS)
    assert "".join(d.text for d in deltas if d.kind == "content") == "".join(whole.content_parts)
    assert [(c.name, c.arguments, c.finished) for c in reader.calls] == [
        (c.name, c.arguments, c.finished) for c in whole.calls]


def test_the_reader_holds_a_possible_call_and_streams_prose():
    reader = CallReader(tool_names=TOOLS)
    assert reader.feed("Sure, ") == [Delta("content", "Sure, ")]
    assert reader.feed("<tool_") == []
    assert reader.feed("call>{") == []
    assert CallReader(tool_names=TOOLS).feed('{"name"') == []


def test_raw_text_map_returns_the_model_text_for_resent_calls():
    raw = '<tool_call>\n{"name": "grep", "arguments": {"pattern": "x"}}\n</tool_call>'
    content, calls = parse_tool_calls(raw, TOOLS)
    table = RawTextMap()
    table.remember(raw, content, calls, ["call_1"])
    assert table.raw_text(None, calls, ["call_1"]) == raw
    assert table.raw_text(None, calls, ["other-id"]) == raw            # matched by content
    assert "<tool_call>" in table.raw_text(None, calls[:0] + calls, [None])


def _msgs(*roles_and_texts):
    return [Msg(role, text) for role, text in roles_and_texts]


def test_plans_continue_fork_and_new():
    conv = _msgs(("user", "a"), ("assistant", "A"), ("user", "b"), ("assistant", "B"))
    assert plan(conv, [*conv, Msg("user", "c")]).action == "continue"
    edited = plan(conv, [*conv[:2], Msg("user", "b2")])
    assert (edited.action, edited.keep, [m.content for m in edited.tail]) == ("fork", 2, ["b2"])
    regen = plan(conv, conv[:3])
    assert (regen.action, regen.keep) == ("fork", 2)
    assert plan(conv, [Msg("user", "z")]).action == "new"
    assert plan([], [Msg("user", "z")]).action == "continue"


def test_canonical_form_merges_inputs_and_reads_files():
    request = ChatRequest.model_validate({"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "file", "file": {"filename": "n.txt", "file_data": "data:text/plain;"
                                                               "base64,aGVsbG8="}}]},
        {"role": "user", "content": "twice"}]})
    canonical = canonicalize(request, RawTextMap())
    assert canonical.system == "S"
    assert len(canonical.messages) == 1
    message = canonical.messages[0]
    assert message.attachments == [("n.txt", "hello")] and message.text == "look\n\ntwice"
    assert "[file n.txt]" in message.content


@pytest.mark.parametrize(("header", "ok"), [
    ("127.0.0.1:8765", True), ("localhost", True), ("[::1]:80", True), ("LOCALHOST:1", True),
    ("evil.example:8765", False), ("", False), ("127.0.0.1.evil.example", False), ("10.0.0.5:8765", False)])
def test_host_header_check(header, ok):
    assert ServerConfig().host_allowed(header) is ok


def test_configured_host_and_remote_bind():
    assert ServerConfig(allowed_hosts=["my-box.lan"]).host_allowed("my-box.lan:8765")
    with pytest.raises(ValueError, match="allow-remote"):
        ServerConfig(host="0.0.0.0").check_bind()
    assert "WARNING" in ServerConfig(host="0.0.0.0", allow_remote=True).check_bind()
    assert ServerConfig().check_bind() is None


def test_key_check():
    assert key_matches("sekrit", "Bearer sekrit")
    assert not key_matches("sekrit", "Bearer sekri")
    assert not key_matches("sekrit", "Basic sekrit")
    assert not key_matches("sekrit", None)
