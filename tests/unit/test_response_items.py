"""Issue 60, the Responses API's streamed items on plain objects: each format's replies, split at every character
boundary, give the events OpenAI's Responses stream sends (an item announced, grown, closed, one at a time, in the
order written) and the same output items as the whole reply read at once; call ids are the reader's, as stored."""

from __future__ import annotations

import itertools

import pytest

from evoke_engine.server.response_items import OutputItems
from evoke_engine.server.toolcall_formats import HERMES, format_named
from evoke_engine.server.toolcall_stream import CallReader

from .test_issue60_toolcall_formats import PROSE, TOOL_NAMES
from .test_toolcall_stream import numbered_ids, replies, splits

pytestmark = pytest.mark.unit

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


def numbered_messages():
    counter = itertools.count(1)
    return lambda: f"msg_{next(counter)}"


def events_of(pieces: list[str], fmt=HERMES, tools=TOOL_NAMES, forced: bool = False,
              status: str = "completed") -> tuple[list[tuple[str, dict]], OutputItems, CallReader]:
    reader = CallReader(fmt, tools, forced=forced, new_id=numbered_ids())
    items = OutputItems(reader, "msg_0", numbered_messages())
    events = [e for piece in pieces for e in items.add(reader.feed(piece))]
    events += items.add(reader.close())
    return events + items.end(status), items, reader


def check_stream(events: list[tuple[str, dict]], output: list[dict]) -> None:
    """Each item is added, grown and done before the next one begins; its deltas join to the item done; the items
    done are `output`."""
    done, at = [], 0
    while at < len(events):
        kind, fields = events[at]
        assert kind == "response.output_item.added" and fields["output_index"] == len(done)
        item = fields["item"]
        assert item["status"] == "in_progress"
        end = next(i for i in range(at, len(events)) if events[i][0] == "response.output_item.done")
        body = events[at + 1:end]
        assert all(f["output_index"] == len(done) and f["item_id"] == item["id"] for _, f in body)
        final = events[end][1]["item"]
        assert final["id"] == item["id"] and events[end][1]["output_index"] == len(done)
        if item["type"] == "function_call":
            assert (item["call_id"], item["name"], item["arguments"]) == (final["call_id"], final["name"], "")
            kinds = [k for k, _ in body]
            closing = ["response.function_call_arguments.done"] if final["status"] == "completed" else []
            assert kinds == ["response.function_call_arguments.delta"] * (len(kinds) - len(closing)) + closing
            assert "".join(f["delta"] for k, f in body if k.endswith(".delta")) == final["arguments"]
            if closing:
                assert body[-1][1]["arguments"] == final["arguments"] and body[-1][1]["name"] == final["name"]
        else:
            kinds = [k for k, _ in body]
            assert kinds[0] == "response.content_part.added" and kinds[-2:] == [
                "response.output_text.done", "response.content_part.done"]
            assert set(kinds[1:-2]) <= {"response.output_text.delta"}
            text = "".join(f["delta"] for k, f in body if k == "response.output_text.delta")
            assert text == body[-2][1]["text"] == final["content"][0]["text"] == body[-1][1]["part"]["text"]
        done.append(final)
        at = end + 1
    assert done == output


@pytest.mark.parametrize(("name", "reply"), list(replies()))
def test_every_split_streams_the_items_of_the_whole_reply(name, reply):
    fmt = format_named(name)
    whole_events, whole, whole_reader = events_of([reply], fmt)
    check_stream(whole_events, whole.output)
    calls = [i for i in whole.output if i["type"] == "function_call"]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls if c["status"] == "completed"] == [
        (c.call_id, c.name, c.arguments) for c in whole_reader.finished_calls()]     # what finish() stores
    for pieces in splits(reply):
        events, items, _ = events_of(pieces, fmt)
        check_stream(events, items.output)
        assert items.output == whole.output


def test_prose_then_a_call_then_prose_are_three_items_in_order():
    reply = "Let me check.\n" + CALL + "\nIt is sunny there."
    for pieces in splits(reply):
        events, items, reader = events_of(pieces)
        check_stream(events, items.output)
        assert [i["type"] for i in items.output] == ["message", "function_call", "message"]
        assert items.output[0]["content"][0]["text"] == "Let me check."          # no spacing at a call's edges
        assert items.output[2]["content"][0]["text"] == "It is sunny there."
        assert [i["id"] for i in items.output if i["type"] == "message"] == ["msg_0", "msg_1"]
        assert items.output[1]["call_id"] == reader.finished_calls()[0].call_id == "call_0"
        assert items.output[1]["arguments"] == '{"city": "Paris", "unit": "c"}'


def test_a_call_is_done_once_its_closing_tag_is_read_not_at_the_reply_end():
    reader = CallReader(HERMES, TOOL_NAMES, new_id=numbered_ids())
    items = OutputItems(reader, "msg_0")
    events = [e for ch in CALL for e in items.add(reader.feed(ch))]
    assert [k for k, _ in events][-2:] == ["response.function_call_arguments.done", "response.output_item.done"]
    deltas = [f["delta"] for k, f in events if k == "response.function_call_arguments.delta"]
    assert len(deltas) > 5 and "".join(deltas) == '{"city": "Paris", "unit": "c"}'
    assert items.add(reader.close()) == [] and [k for k, _ in items.end("completed")] == []


@pytest.mark.parametrize("forced", [False, True])
def test_a_call_cut_short_closes_incomplete_without_arguments_done(forced):
    reply = CALL[:CALL.index("Paris") + 3]
    events, items, reader = events_of(list(reply), forced=forced, status="incomplete")
    check_stream(events, items.output)
    assert [(i["type"], i["status"]) for i in items.output] == [("function_call", "incomplete")]
    assert items.output[0]["arguments"] == '{"city": "Par'
    assert reader.unfinished and reader.finished_calls() == []          # not among the stored calls


def test_text_without_calls_is_one_message_as_written():
    for text in [*PROSE, "Hello there!\n\n", "  spaced  "]:
        for tools in (TOOL_NAMES, frozenset()):
            for pieces in splits(text):
                events, items, reader = events_of(pieces, tools=tools)
                check_stream(events, items.output)
                assert [i["content"][0]["text"] for i in items.output] == [reader.content] == [text]


def test_an_empty_reply_is_an_empty_message_with_the_replys_status():
    events, items, _ = events_of([""], status="incomplete")
    check_stream(events, items.output)
    assert [(i["type"], i["status"], i["content"][0]["text"]) for i in items.output] == [
        ("message", "incomplete", "")]


def test_two_calls_in_one_reply_are_two_items():
    reply = f"{CALL}\n{CALL.replace('Paris', 'Rome')}"
    for pieces in splits(reply):
        events, items, reader = events_of(pieces)
        check_stream(events, items.output)
        assert [i["call_id"] for i in items.output] == ["call_0", "call_1"]
        assert [i["status"] for i in items.output] == ["completed", "completed"]
