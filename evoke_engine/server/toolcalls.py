"""Tool calls in model text, in the format of the model's template (`toolcall_formats`: Hermes/Qwen `<tool_call>`,
Llama 3.x JSON, Mistral `[TOOL_CALLS]`; Hermes unless told otherwise) and a bare JSON call at the reply's start.

Invariants: a call is recognised only when its JSON parses and names a declared tool with object arguments; a closed
call that does not is text, an unfinished one at the reply's end (a `<tool_call>` never closed, a marker with its
JSON cut short, a bare call's JSON cut short: `max_tokens` ended it) is dropped, so no tool markup reaches `content`
(`drop_unfinished_call`); a reply is read, whole or streamed, by `toolcall_stream.CallReader`, and
`RawTextMap` remembers the raw model text behind every call it returned (ids and content).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from .toolcall_formats import HERMES, ParsedCall, ToolCallFormat, canonical_arguments
from .toolcall_stream import CallReader, drop_unfinished_call, new_call_id

__all__ = ["TAG_CLOSE", "TAG_OPEN", "ParsedCall", "RawTextMap", "canonical_arguments",
           "drop_unfinished_call", "new_call_id", "parse_tool_calls", "read_reply", "render_calls"]

TAG_OPEN, TAG_CLOSE = HERMES.open_tag, HERMES.close_tag


def read_reply(text: str, tool_names: set[str], fmt: ToolCallFormat = HERMES, *, forced: bool = False) -> CallReader:
    """A finished reply read whole, as a stream reads it piece by piece (`CallReader`): the same calls and content."""
    reader = CallReader(fmt, tool_names, forced=forced)
    reader.feed(text)
    reader.close()
    return reader


def parse_tool_calls(text: str, tool_names: set[str], fmt: ToolCallFormat = HERMES, *,
                     forced: bool = False) -> tuple[str | None, list[ParsedCall]]:
    """(content left, calls) of a finished reply; ([text], []) when it holds no valid call. An unfinished call at
    its end is dropped from the content (`drop_unfinished_call`, `forced` as there)."""
    if not tool_names:
        return text, []
    reader = read_reply(text, tool_names, fmt, forced=forced)
    return reader.content, [ParsedCall(c.name, c.arguments) for c in reader.finished_calls()]


def render_calls(calls: list[ParsedCall], fmt: ToolCallFormat = HERMES) -> str:
    """The text of calls the model did not write itself (a client-made assistant message), in `fmt`'s markup."""
    return fmt.render(calls)


class RawTextMap:
    """Raw model text behind the tool calls returned, by call id and by call content (bounded, LRU)."""

    def __init__(self, limit: int = 4096, fmt: ToolCallFormat = HERMES) -> None:
        self.fmt = fmt               # the markup of calls it renders itself: the loaded model's format
        self._by_id: OrderedDict[str, str] = OrderedDict()
        self._by_calls: OrderedDict[str, str] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    @staticmethod
    def _calls_key(content: str | None, calls: list[ParsedCall]) -> str:
        return json.dumps([(content or "").strip(), [(c.name, canonical_arguments(c.arguments) or c.arguments)
                                                     for c in calls]])

    def remember(self, raw: str, content: str | None, calls: list[ParsedCall], ids: list[str]) -> None:
        with self._lock:
            for call_id in ids:
                self._by_id[call_id] = raw
            self._by_calls[self._calls_key(content, calls)] = raw
            for table in (self._by_id, self._by_calls):
                while len(table) > self._limit:
                    table.popitem(last=False)

    def raw_text(self, content: str | None, calls: list[ParsedCall], ids: list[str | None]) -> str:
        """The raw text of an assistant message a client re-sends with `tool_calls`."""
        with self._lock:
            for call_id in ids:
                if call_id and call_id in self._by_id:
                    return self._by_id[call_id]
            raw = self._by_calls.get(self._calls_key(content, calls))
        if raw is not None:
            return raw
        return ((content or "").strip() + "\n" if content and content.strip() else "") + render_calls(calls, self.fmt)

    def dump(self) -> dict:
        with self._lock:
            return {"by_id": list(self._by_id.items())[-512:], "by_calls": list(self._by_calls.items())[-512:]}

    def load(self, data: dict) -> None:
        with self._lock:
            for key, value in data.get("by_id", []):
                self._by_id[str(key)] = str(value)
            for key, value in data.get("by_calls", []):
                self._by_calls[str(key)] = str(value)
