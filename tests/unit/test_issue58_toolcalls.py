"""Issue 58 item 6 on plain text: a tool call cut short (max_tokens) leaves no markup in `content`, streamed or
not, and its finish_reason is `length`; finished calls keep `tool_calls`."""

from __future__ import annotations

import pytest

from evoke_engine.server.service import finish_reason
from evoke_engine.server.toolcall_stream import CallReader
from evoke_engine.server.toolcalls import drop_unfinished_call, parse_tool_calls

TOOLS = {"get_weather"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(("text", "before"), [
    ("<tool_call>", ""), ('<tool_call>\n{"name": "get_wea', ""), ("<tool_ca", ""),
    ("Let me look.\n<tool_call>", "Let me look."), ('Let me look.\n<tool_call>\n{"name": "get_wea', "Let me look."),
    ("Let me look.\n<tool_ca", "Let me look."),
    ('{"name": "get_weather", "argum', ""), ('```json\n{"name": "get_weather"', "")])
def test_a_cut_call_leaves_no_markup(text, before):
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == before
    assert drop_unfinished_call(text) == (before, True)
    reader = CallReader(tool_names=TOOLS)
    deltas = [d for ch in text for d in reader.feed(ch)] + reader.close()
    streamed = "".join(d.text for d in deltas if d.kind == "content")
    assert streamed.rstrip() == before          # the newline before the call may have gone out already
    assert not any(d.kind == "opened" for d in deltas)


def test_a_finished_call_then_a_cut_one_keeps_the_finished_call():
    content, calls = parse_tool_calls(CALL + "\n<tool_call>\n{\"name\": \"get", TOOLS)
    assert [c.name for c in calls] == ["get_weather"] and content is None


def test_text_that_is_not_an_unfinished_call_stays():
    for text in ("a < b", "use <tool_call> tags </tool_call> like this", '{"answer": 4', "plain prose"):
        assert drop_unfinished_call(text) == (text, False)
    content, calls = parse_tool_calls(CALL, TOOLS)
    assert content is None and len(calls) == 1


def test_finish_reasons():
    assert finish_reason("max_tokens", False, True) == "length"
    assert finish_reason("max_tokens", True, True) == "length"         # a finished call, then one cut
    assert finish_reason("budget", False, False) == "length"
    assert finish_reason("max_tokens", True, False) == "tool_calls"    # cut right after a finished call
    assert finish_reason("eos", True, False) == "tool_calls"
    assert finish_reason("eos", False, False) == finish_reason("stop", False, False) == "stop"
