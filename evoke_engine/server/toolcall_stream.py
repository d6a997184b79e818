"""Tool calls read as the reply is written, in the loaded model's format (`toolcall_formats`): content, each call's
name once known, and its arguments' JSON text as it grows; the one reader of a reply, streamed or not.

Invariants: what it has handed out is never taken back, so the whole reply read at once gives the calls, ids and
content a stream gave piece by piece (tested at every character boundary); a call is opened only once its name is a
declared tool and its arguments have begun as a JSON object (or closed as a string holding one), and its arguments
are the object's text as the model wrote it; a call cut short at the reply's end is not among `calls` (`unfinished`).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import NamedTuple

from .toolcall_formats import HERMES, Hermes, Mistral, ToolCallFormat, first_marker, loads, partial_marker_end

_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}
_ARGUMENT_KEYS = ("arguments", "parameters")
_WORD = re.compile(r"[A-Za-z0-9_.\-]*")
_CALL_ID = re.compile(r"\[CALL_ID\]\s*[A-Za-z0-9_\-]*")
_JSON_CHARS = set('{}[]:,"0123456789-+.eEtruefalsn')    # outside strings: brackets, numbers, true, false, null
_SEPARATORS = ("```json", "```", "[", "]", ",", ";")     # what may stand between calls outside Hermes tags


def drop_unfinished_call(text: str, fmt: ToolCallFormat = HERMES,
                         tool_names: set[str] | frozenset[str] = frozenset(), *,
                         forced: bool = False) -> tuple[str, bool]:
    """(`text` without the unfinished tool call it ends with, whether there was one): a `<tool_call>` never closed
    (or the start of that tag), a marker whose call is cut short, or a bare call (`{"name": ...`) whose JSON does
    not parse. `tool_names` lets a format whose bare call starts with the tool's name (Mistral's `name[ARGS]{`)
    find one cut short. `forced` (tool_choice forced a call: the grammar allowed nothing else): a reply that holds
    no whole call is all of it the call cut short, even a lone `<`."""
    if forced and text.strip() and not fmt.parse(text, set(tool_names))[1]:
        return "", True
    at = fmt.unfinished_at(text, set(tool_names))
    if at is None:
        return text, False
    return text[:at].rstrip(), True


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class Delta(NamedTuple):
    """One piece of a streamed reply: `content` text, a call `opened` (its name), or an `arguments` piece."""
    kind: str
    text: str
    index: int = -1
    call_id: str = ""


@dataclass
class StreamedCall:
    call_id: str
    name: str
    arguments: str = ""          # the arguments' JSON text handed out so far
    finished: bool = False


class ObjectReader:
    """One JSON object read a character at a time: its top-level keys in order, each closed value's raw text, and
    where the arguments value begins. `arguments_only`: the whole object is the arguments (Mistral's `name{...}`)."""

    def __init__(self, text_at: int, arguments_only: bool = False) -> None:
        self.start = text_at                 # where its `{` is in the reply
        self.raw = ""
        self.stack: list[str] = []
        self.in_string = self.escaped = False
        self.expect = "open"                 # open | key | colon | value | in_value | comma | done
        self.key = ""
        self.key_start = self.value_start = -1
        self.keys: list[str] = []
        self.values: dict[str, str] = {}
        self.arguments_start = 0 if arguments_only else -1
        self.broken = False

    @property
    def done(self) -> bool:
        return self.expect == "done"

    def feed(self, text: str, at: int) -> int:
        """Read `text` from `at` up to the object's end; where it stopped."""
        while at < len(text) and not self.done and not self.broken:
            self._char(text[at])
            at += 1
        return at

    def _char(self, ch: str) -> None:
        i, self.raw = len(self.raw), self.raw + ch
        depth = len(self.stack)
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if depth == 1 and self.expect == "key":
                    self.key, self.expect = loads(self.raw[self.key_start:]) or "", "colon"
                    self.keys.append(self.key)
                elif depth == 1 and self.expect == "in_value":
                    self._value_ends(i + 1)
            return
        if ch.isspace():
            return
        if ch not in _JSON_CHARS:                             # no JSON value holds it outside a string
            self.broken = True
            return
        if self.expect == "open":
            if ch != "{":
                self.broken = True
            self.stack.append(ch)
            self.expect = "key"
            return
        if depth == 1 and self.expect == "in_value" and ch in ",}" and self.raw[self.value_start] not in '"{[':
            self._value_ends(i)                               # a number, true, false or null ends
        if ch == '"':
            self.in_string = True
            if depth == 1 and self.expect == "key":
                self.key_start = i
            elif depth == 1 and self.expect == "value":
                self._value_begins(i)
            elif depth == 1 and self.expect != "in_value":
                self.broken = True
        elif ch in "{[":
            if depth == 1 and self.expect == "value":
                self._value_begins(i)
            elif depth == 1:
                self.broken = True
            self.stack.append(ch)
        elif ch in "}]":
            if not self.stack or "{[" ["}]".index(ch)] != self.stack[-1] or (depth == 1 and self.expect in (
                    "colon", "value")) or (depth == 1 and self.expect == "key" and self.keys):
                self.broken = True
                return
            self.stack.pop()
            if len(self.stack) == 1:
                self._value_ends(i + 1)
            elif not self.stack:
                self.expect = "done"
                self.broken = loads(self.raw) is None
        elif depth == 1:
            if ch == ":" and self.expect == "colon":
                self.expect = "value"
            elif ch == "," and self.expect == "comma":
                self.expect = "key"
            elif self.expect == "value":
                self._value_begins(i)
            elif self.expect != "in_value":
                self.broken = True

    def _value_begins(self, i: int) -> None:
        self.value_start, self.expect = i, "in_value"
        if self.key in _ARGUMENT_KEYS and self.arguments_start < 0:
            self.arguments_start = i

    def _value_ends(self, end: int) -> None:
        self.values.setdefault(self.key, self.raw[self.value_start:end])
        self.expect = "comma"

    def arguments_so_far(self) -> str:
        """The arguments object's text as far as it is written ('' before it begins or when it is no object)."""
        if self.arguments_start < 0 or not self.raw[self.arguments_start:].startswith("{"):
            return ""
        if self.arguments_start == 0:
            return self.raw if self.done else self.raw.rstrip()
        key = next(k for k in self.keys if k in _ARGUMENT_KEYS)
        return self.values.get(key, self.raw[self.arguments_start:].rstrip())


class CallReader:
    """A reply read piece by piece (`feed`, then `close`): the deltas to stream, and at the end its `content`,
    finished `calls` and whether a call was cut short (`unfinished`)."""

    def __init__(self, fmt: ToolCallFormat = HERMES, tool_names: set[str] | frozenset[str] = frozenset(), *,
                 forced: bool = False, new_id=None) -> None:
        self.fmt, self.tool_names, self.forced = fmt, set(tool_names), forced
        self.new_id = new_id or new_call_id
        self.text = ""
        self.at = 0                          # the text before it is decided
        self.started = False                 # content sent or a call region begun: no bare call any more
        self.region: str | None = None       # None (content), "tag" (inside <tool_call>), "calls" (bare or marked)
        self.region_start = 0                # where the region began (its marker, or the bare call)
        self.hold_from = 0                   # the text from here is held: not yet content, not yet a call
        self.reader: ObjectReader | None = None
        self.named: str | None = None        # a Mistral `name` read, its arguments object not begun
        self.call: StreamedCall | None = None     # the call being read, once opened
        self.after_call = False              # inside <tool_call>, its call read: the closing tag is next
        self.calls: list[StreamedCall] = []
        self.content_parts: list[str] = []
        self.unfinished = False
        self.closed = False

    # -- the results ---------------------------------------------------------------------------------------------
    @property
    def content(self) -> str | None:
        """The reply's text less its calls: stripped (None when empty) beside calls, as written without them."""
        text = "".join(self.content_parts)
        if self.finished_calls():
            return text.strip() or None
        return text.rstrip() if self.unfinished else text

    def finished_calls(self) -> list[StreamedCall]:
        return [c for c in self.calls if c.finished]

    # -- reading -------------------------------------------------------------------------------------------------
    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        out: list[Delta] = []
        if not self.tool_names:
            self._content_to(len(self.text), out)
            return out
        while self._step(out):
            pass
        return out

    def close(self) -> list[Delta]:
        """The deltas the reply's end releases (content held back that was no call); sets `unfinished`."""
        out: list[Delta] = []
        if self.closed:
            return out
        self.closed = True
        if not self.tool_names:
            return out
        if self.after_call:                                  # its `</tool_call>` never came: cut short
            self.calls[-1].finished, self.unfinished = False, True
            return out
        if self.call is not None or self.named is not None:
            self.unfinished = True                           # cut short after it was opened: not a call
            return out
        if self.forced and not self.calls:                   # the grammar allowed nothing but the call: all of
            self.unfinished = bool(self.text.strip())        # it was the call, cut short
            return out
        held = self.text[self.hold_from:]
        if self.region is not None and self.calls and any(s.startswith(held.strip()) for s in _SEPARATORS):
            return out                                       # a closing fence begun after the calls
        kept, self.unfinished = drop_unfinished_call(held, self.fmt, self.tool_names,
                                                     forced=self.forced and not self.calls)
        if kept and not self.forced:
            self._emit_content(kept, out)
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self.reader is not None:
            return self._read_object(out)
        if self.region is None:
            return self._read_content(out)
        return self._read_between(out)

    def _emit_content(self, text: str, out: list[Delta]) -> None:
        if text and not self.forced:
            self.content_parts.append(text)
            out.append(Delta("content", text))
            self.started = True

    def _content_to(self, end: int, out: list[Delta]) -> None:
        if end > self.at:
            self._emit_content(self.text[self.at:end], out)
            self.at = end
        self.hold_from = self.at

    def _read_content(self, out: list[Delta]) -> bool:
        if not self.started and not self.calls:
            head = self.text.lstrip()
            if not head and not self.forced:
                return False
            if head and self.fmt.holds(head, self.tool_names):
                self._begin_region("calls", len(self.text) - len(head), 0)
                return True
        marker = first_marker(self.text[self.at:], self.fmt.markers)
        if marker >= 0:
            at = self.at + marker
            self._content_to(at, out)
            kind = "tag" if isinstance(self.fmt, Hermes) else "calls"
            self._begin_region(kind, at + len(self.fmt.markers[0] if kind == "tag" else next(
                m for m in self.fmt.markers if self.text.startswith(m, at))), at)
            return True
        safe = self.at + partial_marker_end(self.text[self.at:], self.fmt.markers)
        if self.calls or self.forced:                      # text after calls: sent once it is more than spacing
            safe = self.at + len(self.text[self.at:safe].rstrip())
        self._content_to(safe, out)
        return False

    def _begin_region(self, kind: str, at: int, start: int) -> None:
        self.region, self.region_start, self.hold_from, self.at = kind, start, start, at
        self.started = True

    def _end_region(self, at: int, out: list[Delta]) -> None:
        """The text from the held point on is no call: it is content (a region that opened no call, all of it)."""
        self.region, self.named, self.reader = None, None, None
        self.at = self.hold_from
        self._content_to(at, out)

    def _read_between(self, out: list[Delta]) -> bool:
        at = self.at
        while at < len(self.text) and self.text[at].isspace():
            at += 1
        rest = self.text[at:]
        if not rest:
            return False
        if self.region == "tag":
            return self._read_tag(rest, at, out)
        if self.named is not None:
            return self._read_named(rest, at, out)
        if rest[0] == "{":
            self.at, self.reader = at, ObjectReader(at)
            return True
        tokens = (*self.fmt.markers, *(("[ARGS]", "[CALL_ID]") if isinstance(self.fmt, Mistral) else ()))
        for token in tokens:
            if rest.startswith(token):
                self._consumed(at + len(token))
                return True
        if any(token.startswith(rest) for token in tokens):
            return False                                     # a marker still being written
        if any(token.startswith(rest) and token != rest for token in _SEPARATORS):
            return False                                     # a fence still being written ("```" of "```json")
        for token in _SEPARATORS:
            if rest.startswith(token):
                self._consumed(at + len(token))
                return True
        if isinstance(self.fmt, Mistral):
            word = _WORD.match(rest).group(0)
            if word == rest and any(name.startswith(word) for name in self.tool_names):
                return False                                 # a tool's name may still be being written
            if word in self.tool_names:
                self.named = word
                self._consumed(at + len(word), hold=True)
                return True
        self._end_region(at, out)
        return True

    def _read_named(self, rest: str, at: int, out: list[Delta]) -> bool:
        if rest[0] == "{":
            self.at, self.reader = at, ObjectReader(at, arguments_only=True)
            return True
        if rest.startswith("[ARGS]"):
            self._consumed(at + len("[ARGS]"), hold=True)
            return True
        match = _CALL_ID.match(rest)
        if match is not None and match.end() < len(rest):
            self._consumed(at + match.end(), hold=True)
            return True
        if "[ARGS]".startswith(rest) or "[CALL_ID]".startswith(rest[:9]):
            return False
        self._end_region(at, out)
        return True

    def _read_tag(self, rest: str, at: int, out: list[Delta]) -> bool:
        close = HERMES.close_tag
        if self.after_call:
            if rest.startswith(close):                        # the call's closing tag: content may follow
                self.region, self.at, self.after_call = None, at + len(close), False
                self.hold_from = self.at
                return True
            if close.startswith(rest):
                return False
            self.region, self.after_call = None, False       # no closing tag: what follows is content
            self.at = self.hold_from = at
            return True
        if rest[0] == "{":
            self.at, self.reader = at, ObjectReader(at)
            return True
        self._end_region(at, out)
        return True

    def _consumed(self, at: int, hold: bool = False) -> None:
        self.at = at
        if self.calls and self.hold_from > self.region_start and not hold and self.named is None:
            self.hold_from = at                              # separators after a call are no content

    def _read_object(self, out: list[Delta]) -> bool:
        reader = self.reader
        self.at = reader.feed(self.text, self.at)
        if self.call is None:
            if reader.broken or not self._may_be_call(reader):
                self._end_region(self.at, out)
                return True
            self._open_if_ready(reader, out)
        if self.call is not None:
            self._grow_arguments(reader, out)
        if not reader.done and not reader.broken:
            return False
        if self.call is None:                                  # closed, never opened: a string's arguments or none
            self._end_region(self.at, out)
            return True
        call, self.call, self.reader, self.named = self.call, None, None, None
        if reader.broken and not self._arguments_closed(reader):
            self._end_region(self.at, out)                     # malformed inside its arguments: no call, and
            return True                                        # what follows is content
        call.finished, self.after_call = True, self.region == "tag"
        self.hold_from = self.at                               # past the call: held text begins after it
        return True

    @staticmethod
    def _arguments_closed(reader: ObjectReader) -> bool:
        if reader.arguments_start == 0:
            return False
        key = next((k for k in reader.keys if k in _ARGUMENT_KEYS), None)
        return key is not None and isinstance(loads(reader.values.get(key, "")), dict)

    def _name_of(self, reader: ObjectReader) -> str | None:
        if self.named is not None:
            return self.named
        name = loads(reader.values["name"]) if "name" in reader.values else None
        return name if isinstance(name, str) else None

    def _may_be_call(self, reader: ObjectReader) -> bool:
        if reader.arguments_start == 0:
            return reader.raw.startswith("{")
        if any(k not in _CALL_KEYS for k in reader.keys) or reader.values.get("type", '"function"') != '"function"':
            return False
        name = self._name_of(reader)
        if "name" in reader.values and name not in self.tool_names:
            return False
        if reader.arguments_start >= 0 and reader.raw[reader.arguments_start] not in '{"':
            return False
        if reader.done:
            return name in self.tool_names and bool(reader.arguments_so_far() or
                                                    self._closed_arguments(reader) is not None)
        return True

    def _closed_arguments(self, reader: ObjectReader) -> str | None:
        """The arguments of a closed call whose arguments are no object literal: a string holding one, or none."""
        key = next((k for k in reader.keys if k in _ARGUMENT_KEYS), None)
        if key is None:
            return "{}"
        inner = loads(reader.values[key])
        if isinstance(inner, str) and isinstance(loads(inner), dict):
            return inner.strip()
        return None

    def _open_if_ready(self, reader: ObjectReader, out: list[Delta]) -> None:
        name = self._name_of(reader)
        if name is None:
            return
        if reader.arguments_so_far() or reader.done:
            self.call = StreamedCall(self.new_id(), name)
            self.calls.append(self.call)
            out.append(Delta("opened", name, len(self.calls) - 1, self.call.call_id))
            if reader.done and not reader.arguments_so_far():
                self._hand_out(self._closed_arguments(reader) or "{}", out)

    def _grow_arguments(self, reader: ObjectReader, out: list[Delta]) -> None:
        so_far = reader.arguments_so_far()
        if len(so_far) > len(self.call.arguments) and so_far.startswith(self.call.arguments):
            self._hand_out(so_far[len(self.call.arguments):], out)

    def _hand_out(self, piece: str, out: list[Delta]) -> None:
        self.call.arguments += piece
        out.append(Delta("arguments", piece, len(self.calls) - 1, self.call.call_id))
