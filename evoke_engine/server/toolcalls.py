"""Tool calls in model text: Hermes/Qwen `<tool_call>{json}</tool_call>` and a bare JSON object
`{"name": ..., "arguments": {...}}` (the shape the engine's tools block documents).

Invariants: a call is recognised only when its JSON parses and names a declared tool with object
arguments; a closed call that does not is text, an unfinished one at the reply's end (a `<tool_call>` never
closed, a bare call's JSON cut short: `max_tokens` ended it) is dropped, so no tool markup reaches `content`
(`drop_unfinished_call`). `StreamSplitter` never streams text that may still turn out to be a call, and
`RawTextMap` remembers the raw model text behind every call it returned (ids and content).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCE = re.compile(r"^(?:```(?:json)?\s*)?(.*?)(?:\s*```)?$", re.DOTALL)     # optional code fences
_BARE_CALL_START = re.compile(r'^\s*(?:```(?:json)?\s*)?\[?\s*\{\s*"name"\s*:', re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str            # canonical JSON text

    def as_openai(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def canonical_arguments(arguments) -> str | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def _call_of(obj, tool_names: set[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments", "parameters"}:
        return None
    name = obj.get("name")
    args = canonical_arguments(obj.get("arguments", obj.get("parameters", {})))
    if not isinstance(name, str) or name not in tool_names or args is None:
        return None
    return ParsedCall(name, args)


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def drop_unfinished_call(text: str) -> tuple[str, bool]:
    """(`text` without the unfinished tool call it ends with, whether there was one): a `<tool_call>` never closed
    (or the start of that tag), or a bare call (`{"name": ...`) whose JSON does not parse."""
    at = text.rfind(TAG_OPEN)
    if at >= 0 and text.find(TAG_CLOSE, at) < 0:
        return text[:at].rstrip(), True
    for k in range(min(len(TAG_OPEN) - 1, len(text)), 1, -1):       # the tag itself cut: "<tool_ca"
        if text.endswith(TAG_OPEN[:k]):
            return text[:-k].rstrip(), True
    if at < 0 and _BARE_CALL_START.match(text) and _loads(_FENCE.match(text.strip()).group(1)) is None:
        return "", True
    return text, False


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """(content left, calls) of a finished reply; ([text], []) when it holds no valid call. An unfinished call at
    its end is dropped from the content (`drop_unfinished_call`)."""
    if not tool_names:
        return text, []
    text, _ = drop_unfinished_call(text)
    if TAG_OPEN in text:
        calls = []
        for body in _HERMES.findall(text):
            call = _call_of(_loads(body), tool_names)
            if call is None:
                return text, []            # one malformed call: the whole reply stays text
            calls.append(call)
        if calls:
            rest = _HERMES.sub("", text).strip()
            return (rest or None), calls
        return text, []
    stripped = text.strip()
    body = _FENCE.match(stripped).group(1)
    if body.startswith(("{", "[")):
        obj = _loads(body)
        items = obj if isinstance(obj, list) and obj else [obj]
        calls = [_call_of(item, tool_names) for item in items]
        if all(calls):
            return None, calls
    return text, []


def render_calls(calls: list[ParsedCall]) -> str:
    """The Hermes text of calls the model did not write itself (a client-made assistant message)."""
    return "\n".join(f'{TAG_OPEN}\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n{TAG_CLOSE}'
                     for c in calls)


class StreamSplitter:
    """Decides, piece by piece, which reply text can be streamed as content now and which must wait
    until the reply ends because it may be a tool call."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str:
        self.text += piece
        if not self.enabled:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out
        safe = self._safe_end()
        out = self.text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out

    def _safe_end(self) -> int:
        head = self.text.lstrip()
        if not head or head[0] in "{[`":
            return 0                        # may be a bare JSON call: hold all of it
        at = self.text.find(TAG_OPEN)
        if at >= 0:
            return at
        for k in range(min(len(TAG_OPEN) - 1, len(self.text)), 0, -1):
            if TAG_OPEN.startswith(self.text[-k:]):
                return len(self.text) - k
        return len(self.text)

    def unsent(self) -> str:
        """The text held back, once the reply has ended: all of it but an unfinished call at its end."""
        if not self.enabled:
            return self.text[self.sent:]
        kept, _ = drop_unfinished_call(self.text)
        return kept[self.sent:]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class RawTextMap:
    """Raw model text behind the tool calls returned, by call id and by call content (bounded, LRU)."""

    def __init__(self, limit: int = 4096) -> None:
        self._by_id: OrderedDict[str, str] = OrderedDict()
        self._by_calls: OrderedDict[str, str] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    @staticmethod
    def _calls_key(content: str | None, calls: list[ParsedCall]) -> str:
        return json.dumps([(content or "").strip(), [(c.name, c.arguments) for c in calls]])

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
        return ((content or "").strip() + "\n" if content and content.strip() else "") + render_calls(calls)

    def dump(self) -> dict:
        with self._lock:
            return {"by_id": list(self._by_id.items())[-512:], "by_calls": list(self._by_calls.items())[-512:]}

    def load(self, data: dict) -> None:
        with self._lock:
            for key, value in data.get("by_id", []):
                self._by_id[str(key)] = str(value)
            for key, value in data.get("by_calls", []):
                self._by_calls[str(key)] = str(value)
