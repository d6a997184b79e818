"""The tool-call formats of model families, and which one a GGUF's chat template uses: Hermes/Qwen
`<tool_call>{json}</tool_call>`, Llama 3.x JSON `{"name", "parameters"}` (bare, or after `<|python_tag|>`), Mistral
`[TOOL_CALLS][{"name", "arguments", "id"}]` and its newer `[TOOL_CALLS]name[ARGS]{json}`.

Invariants: a call is a declared tool with object arguments (`call_of`); every format also reads its calls with its
markers gone, since the engine's reply text drops control tokens (`<|python_tag|>`, `[TOOL_CALLS]`, `[ARGS]` are
control tokens of their vocabularies): a bare call is recognised at the reply's start only. Detection follows
llama.cpp's `common/chat.cpp` (the first format whose markup the template holds; Hermes when none does).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^(?:```(?:json)?\s*)?(.*?)(?:\s*```)?$", re.DOTALL)     # optional code fences
_BARE_CALL_START = re.compile(r'^\s*(?:```(?:json)?\s*)?\[?\s*\{\s*"(?:type|name)"\s*:', re.DOTALL)
_HERMES_BARE_START = re.compile(r'^\s*(?:```(?:json)?\s*)?\[?\s*\{\s*"name"\s*:', re.DOTALL)
_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}
_DECODER = json.JSONDecoder()


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


def call_of(obj, tool_names: set[str]) -> ParsedCall | None:
    """The call `obj` is ({"name", "arguments" or "parameters"}, maybe a model-written "id" and "type": "function"),
    or None when it is not one of `tool_names` with object arguments."""
    if not isinstance(obj, dict) or set(obj) - _CALL_KEYS or obj.get("type", "function") != "function":
        return None
    name = obj.get("name")
    args = canonical_arguments(obj.get("arguments", obj.get("parameters", {})))
    if not isinstance(name, str) or name not in tool_names or args is None:
        return None
    return ParsedCall(name, args)


def loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def json_cut_short(text: str) -> bool:
    """Whether `text` ends inside a JSON string or with a bracket left open (a value that `max_tokens` cut)."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}":
            if not stack or "[{"["]}".index(ch)] != stack[-1]:
                return False
            stack.pop()
    return in_string or bool(stack)


def json_values(text: str, separators: str = "") -> list | None:
    """The JSON values `text` holds one after another (whitespace, or one of `separators`, between them); None
    when anything else is in it or it holds none."""
    values, at, end = [], 0, len(text)
    while True:
        while at < end and (text[at].isspace() or (values and text[at] in separators)):
            at += 1
        if at >= end:
            return values or None
        try:
            value, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def bare_calls(text: str, tool_names: set[str], separators: str = "") -> list[ParsedCall] | None:
    """The calls of a reply that is nothing but JSON calls (maybe fenced): an object, an array of them, or (with
    `separators`) objects one after another; None when it is not that."""
    body = _FENCE.match(text.strip()).group(1)
    if not body.startswith(("{", "[")):
        return None
    values = json_values(body, separators)
    if values is None or (len(values) > 1 and not separators):
        return None
    items = values[0] if len(values) == 1 and isinstance(values[0], list) and values[0] else values
    calls = [call_of(item, tool_names) for item in items]
    return calls if calls and all(calls) else None


def partial_marker_end(text: str, markers: tuple[str, ...]) -> int:
    """Where a marker cut at the end of `text` begins ("<tool_ca"), else len(text)."""
    for k in range(min(max(map(len, markers), default=0) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return len(text) - k
    return len(text)


def first_marker(text: str, markers: tuple[str, ...]) -> int:
    found = [at for at in (text.find(m) for m in markers) if at >= 0]
    return min(found) if found else -1


class ToolCallFormat:
    """One family's tool-call markup: detection from a chat template, parsing, cut calls, forcing, rendering."""

    name = ""
    label = ""
    markers: tuple[str, ...] = ()       # text that opens a call anywhere in a reply
    separators = ""                     # what may stand between bare JSON calls
    call_key = "arguments"              # the key a forced call's arguments go under
    forced_by_name = False              # a forced call is `named_root` (a name, then its arguments), not one object

    def detect(self, template: str) -> bool:
        raise NotImplementedError

    def parse(self, text: str, tool_names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        """(content left, calls) of a finished reply with its unfinished call already dropped; (text, []) when it
        holds no valid call (one malformed call keeps the whole reply as text)."""
        at = first_marker(text, self.markers)
        if at >= 0:
            calls = self._marked(text[at:], tool_names)
            if calls is None:
                return text, []
            content = text[:at].strip()
            return (content or None), calls
        calls = self._bare(text, tool_names)
        return (None, calls) if calls else (text, [])

    def _marked(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        """The calls of `text`, which begins with a marker; None when it is not calls alone."""
        raise NotImplementedError

    def _bare(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        return bare_calls(text, tool_names, self.separators)

    def unfinished_at(self, text: str, tool_names: set[str]) -> int | None:
        """Where the unfinished call `text` ends with begins (a marker, maybe cut, with no whole call after it;
        a bare call's JSON cut short), or None when it ends with none."""
        cut = partial_marker_end(text, self.markers)
        if len(text) - cut > 1:                                 # the marker itself cut: "<|python_ta"
            return cut
        last = max(text.rfind(m) for m in self.markers)
        if last >= 0:
            tail = text[last:]
            marker = next(m for m in self.markers if tail.startswith(m))
            return last if self._cut(tail[len(marker):]) else None
        if _BARE_CALL_START.match(text) and self._bare(text, tool_names) is None and json_cut_short(text):
            return 0
        return None

    def _cut(self, after_marker: str) -> bool:
        """Whether the text after a call's marker is a call cut short."""
        return not after_marker.strip() or json_cut_short(after_marker)

    def holds(self, head: str, tool_names: set[str]) -> bool:
        """Whether a reply starting with `head` (stripped, not empty) may still turn out to be a bare call."""
        return head[0] in "{[`"

    def render(self, calls: list[ParsedCall]) -> str:
        """The text of calls the model did not write itself (a client-made assistant message)."""
        raise NotImplementedError

    def call_schema(self, name: str, parameters: dict) -> dict:
        """The JSON schema of one forced call to `name` (formats whose call is one JSON object)."""
        return {"type": "object", "properties": {"name": {"const": name}, self.call_key: parameters},
                "required": ["name", self.call_key], "additionalProperties": False}

    def grammar_root(self, call_rule: str) -> str:
        """The GBNF `root` rule around `call_rule` (one forced call)."""
        raise NotImplementedError


class Hermes(ToolCallFormat):
    """Hermes 2 Pro, Qwen 2.5/3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, text around it."""

    name, label = "hermes", "Hermes/Qwen <tool_call>"
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    markers = (open_tag,)
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def detect(self, template: str) -> bool:
        return self.open_tag in template

    def parse(self, text: str, tool_names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        if self.open_tag not in text:
            calls = self._bare(text, tool_names)
            return (None, calls) if calls else (text, [])
        calls = []
        for body in self._CALL.findall(text):
            call = call_of(loads(body), tool_names)
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
        rest = self._CALL.sub("", text).strip()
        return (rest or None), calls

    def unfinished_at(self, text: str, tool_names: set[str]) -> int | None:
        at = text.rfind(self.open_tag)
        if at >= 0 and text.find(self.close_tag, at) < 0:
            return at
        cut = partial_marker_end(text, self.markers)
        if len(text) - cut > 1:                                 # the tag itself cut: "<tool_ca"
            return cut
        if at < 0 and _HERMES_BARE_START.match(text) and loads(_FENCE.match(text.strip()).group(1)) is None:
            return 0
        return None

    def render(self, calls: list[ParsedCall]) -> str:
        return "\n".join(f'{self.open_tag}\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n'
                         f'{self.close_tag}' for c in calls)

    def grammar_root(self, call_rule: str) -> str:
        return f'"{self.open_tag}" {call_rule} "{self.close_tag}"'


class Llama3(ToolCallFormat):
    """Llama 3.1/3.2/3.3: `{"name": ..., "parameters": {...}}` as the whole reply, or after `<|python_tag|>`
    (several: `;` between them)."""

    name, label = "llama3", "Llama 3.x JSON"
    markers = ("<|python_tag|>",)
    separators = ";"
    call_key = "parameters"

    def detect(self, template: str) -> bool:
        return "<|start_header_id|>ipython<|end_header_id|>" in template or "<|python_tag|>" in template

    def _marked(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        return bare_calls(text[len(self.markers[0]):], tool_names, self.separators)

    def render(self, calls: list[ParsedCall]) -> str:
        return "; ".join(f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments}}}' for c in calls)

    def grammar_root(self, call_rule: str) -> str:
        return call_rule


class Mistral(ToolCallFormat):
    """Mistral v3 and Nemo: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcDEF123"}]`; Mistral Small
    3.2, Devstral, Magistral: `[TOOL_CALLS]name[ARGS]{...}` (maybe `[CALL_ID]id` before `[ARGS]`), repeated."""

    name, label = "mistral", "Mistral [TOOL_CALLS]"
    marker = "[TOOL_CALLS]"
    markers = (marker,)
    _NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9_\-]*\s*)?(?:\[ARGS\])?\s*")

    def detect(self, template: str) -> bool:
        return self.marker in template

    def _marked(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        calls: list[ParsedCall] = []
        for segment in text.split(self.marker)[1:]:
            found = self._segment(segment, tool_names)
            if found is None:
                return None
            calls += found
        return calls or None

    def _segment(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        if not text.strip():
            return []
        if text.lstrip().startswith(("[", "{")):
            return bare_calls(text, tool_names)
        return self._named(text, tool_names)

    def _named(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        """`name{...}` calls one after another (the `[ARGS]` form, its control tokens kept or gone)."""
        calls, at = [], 0
        while at < len(text) and text[at:].strip():
            match = self._NAMED.match(text, at)
            if match is None or match.group(1) not in tool_names:
                return None
            try:
                args, at = _DECODER.raw_decode(text, match.end())
            except ValueError:
                return None
            call = call_of({"name": match.group(1), "arguments": args}, tool_names)
            if call is None:
                return None
            calls.append(call)
        return calls or None

    def _bare(self, text: str, tool_names: set[str]) -> list[ParsedCall] | None:
        return bare_calls(text, tool_names) or (self._named(text, tool_names) if text.strip() else None)

    def _cut(self, after_marker: str) -> bool:
        body = after_marker.strip()
        return not body or json_cut_short(body) or not any(c in body for c in "{[")

    def unfinished_at(self, text: str, tool_names: set[str]) -> int | None:
        at = super().unfinished_at(text, tool_names)
        if at is None and first_marker(text, self.markers) < 0 and self._named_cut(text, tool_names):
            return 0
        return at

    def _named_cut(self, text: str, tool_names: set[str]) -> bool:
        match = self._NAMED.match(text)
        return (match is not None and match.group(1) in tool_names and match.end() < len(text)
                and json_cut_short(text[match.end():]))

    def holds(self, head: str, tool_names: set[str]) -> bool:
        if super().holds(head, tool_names):
            return True
        word = re.match(r"[A-Za-z0-9_.\-]*", head).group(0)
        if word == head:                                     # the name may still be being written
            return any(name.startswith(word) for name in tool_names)
        return word in tool_names and head[len(word):].lstrip()[:1] in ("{", "[", "")

    def render(self, calls: list[ParsedCall]) -> str:
        return self.marker + "[" + ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}'
                                             for c in calls) + "]"

    def call_schema(self, name: str, parameters: dict) -> dict:
        schema = super().call_schema(name, parameters)
        schema["properties"]["id"] = {"type": "string"}          # Nemo's templates write a 9-character id
        return schema

    def grammar_root(self, call_rule: str) -> str:
        return f'"{self.marker}" "[" {call_rule} "]"'


class MistralArgs(Mistral):
    """Templates that write `[TOOL_CALLS]name[ARGS]{...}`: read as `Mistral`, forced and rendered in that form."""

    name, label = "mistral_args", "Mistral [TOOL_CALLS]name[ARGS]"
    forced_by_name = True

    def detect(self, template: str) -> bool:
        return self.marker in template and "[ARGS]" in template

    def render(self, calls: list[ParsedCall]) -> str:
        return "".join(f"{self.marker}{c.name}[ARGS]{c.arguments}" for c in calls)

    def named_root(self, alternatives: list[tuple[str, str]]) -> str:
        """The GBNF `root` rule of one call: (tool name, the rule of its arguments) for each tool it may call."""
        options = " | ".join(f"{json.dumps(name + '[ARGS]')} {rule}" for name, rule in alternatives)
        return f'"{self.marker}" ( {options} )'


HERMES = Hermes()
# Checked in this order: the more specific markup first (as llama.cpp does), Hermes when nothing matches.
FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (MistralArgs(), Mistral(), Llama3(), HERMES)}


def format_named(name: str) -> ToolCallFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r} (known: {', '.join(FORMATS)})") from None


@functools.lru_cache(maxsize=16)
def format_of_template(template: str | None) -> ToolCallFormat:
    """The tool-call format a chat template's model writes (Hermes when its markup names none)."""
    if template:
        for fmt in FORMATS.values():
            if fmt is not HERMES and fmt.detect(template):
                return fmt
    return HERMES


def loaded_format(engine) -> ToolCallFormat:
    """The format of the model `engine` has loaded (Hermes while none is)."""
    model = engine.diagnostics()
    return format_of_template(model.template.source if model is not None else None)
