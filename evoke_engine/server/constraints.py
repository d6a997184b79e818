"""Constrained decoding for the endpoint: the GBNF grammar a request asks for, from `response_format`
(`json_object`, `json_schema`), `tool_choice` (`required` or a named function) or the `grammar` extension.

Invariants: the grammar constrains the reply only (the engine builds a sampler chain per reply); JSON schemas are
turned into GBNF by llama-cpp-python's own converter taught integer bounds (`schema_grammar`); a `json_schema`
response format with a keyword no grammar enforces (`multipleOf`, bounds on a non-integer, ...) is a 400 naming it,
never a reply that ignored it (a forced tool call's parameters are only guided: their bounds are enforced, other
keywords left to the model, as clients' tool schemas often carry them); a forced tool call has the form
`toolcalls.py` parses, in the loaded model's format (Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
Llama 3.x: `{"name": ..., "parameters": {...}}`, Mistral: `[TOOL_CALLS][{...}]` or `[TOOL_CALLS]name[ARGS]{...}`);
a request asking for two constraints, or for a schema the converter refuses, gets an `ApiError` 400 naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .. import ENFORCED_SCHEMA_KEYWORDS as ENFORCED
from .. import SchemaRefused, json_grammar, json_schema_grammar, schema_grammar
from .api_errors import ApiError
from .toolcall_formats import HERMES, ToolCallFormat


def _schema_grammar(schema: dict[str, Any], param: str, *, strict: bool = True) -> str:
    """The schema's GBNF; with `strict`, a keyword the grammar cannot enforce is a 400 naming it."""
    try:
        return schema_grammar(schema) if strict else _guided_grammar(schema)
    except SchemaRefused as exc:
        raise ApiError(400, f"{param}: the JSON schema keyword {exc.keyword!r} cannot be enforced on the reply "
                            f"({exc}); remove it (supported: {', '.join(ENFORCED)})", "unsupported_schema_keyword",
                       param) from exc
    except Exception as exc:   # noqa: BLE001 - the converter raises bare exceptions on schemas it cannot express
        raise ApiError(400, f"{param}: the JSON schema cannot be turned into a grammar: {exc}",
                       "invalid_schema", param) from exc


def _guided_grammar(schema: dict[str, Any]) -> str:
    """A tool's parameters as GBNF: integer bounds enforced where they are valid, other keywords ignored."""
    try:
        return schema_grammar(schema)
    except SchemaRefused:
        return json_schema_grammar(json.dumps(schema))


def _tool_call_grammar(tools: list[dict], names: list[str], fmt: ToolCallFormat = HERMES) -> str:
    """One call in `fmt`'s markup (Hermes: `<tool_call>{"name": N, "arguments": {...}}</tool_call>`) naming one of
    `names`, its arguments per the tool's schema."""
    chosen = [(t["function"]["name"], t["function"].get("parameters") or {"type": "object"}) for t in tools
              if t["function"]["name"] in names]
    if fmt.forced_by_name:
        rules, alternatives = [], []
        for i, (name, parameters) in enumerate(chosen):
            prefix = f"tool{i}-"
            rules.append(prefixed_rules(_schema_grammar(parameters, "tool_choice", strict=False), prefix))
            alternatives.append((name, prefix + "root"))
        return "\n".join(rules) + f"\nroot ::= {fmt.named_root(alternatives)}\n"
    options = [fmt.call_schema(name, parameters) for name, parameters in chosen]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    body = _schema_grammar(schema, "tool_choice", strict=False).replace("root ::=", "call ::=", 1)
    return body + f"\nroot ::= {fmt.grammar_root('call')}\n"


_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[A-Za-z0-9_-]+|\s+|.', re.DOTALL)


def prefixed_rules(grammar: str, prefix: str) -> str:
    """`grammar` with every rule it defines renamed `prefix` + name, where defined and where used (string
    literals, character classes and comments left alone), so several grammars can live in one."""
    defined = set(re.findall(r"^([A-Za-z0-9_-]+)\s*::=", grammar, re.M))
    return "".join(prefix + token if token in defined else token for token in _GBNF_TOKEN.findall(grammar))


def forces_call(request) -> bool:
    """Whether `tool_choice` forces a tool call (`required` or a named function): the whole reply is one."""
    return request.tool_choice is not None and request.tool_choice not in ("auto", "none")


def grammar_for(request, call_format: ToolCallFormat = HERMES) -> str | None:
    """The GBNF the reply must match, or None (free text); a forced tool call in `call_format`'s markup (the loaded
    model's format: `toolcall_formats.loaded_format`)."""
    chosen: list[tuple[str, str]] = []
    fmt = request.response_format
    if fmt is not None and fmt.get("type") not in (None, "text"):
        kind = fmt.get("type")
        if kind == "json_object":
            chosen.append(("response_format", json_grammar()))
        elif kind == "json_schema":
            spec = fmt.get("json_schema") or {}
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ApiError(400, "response_format.json_schema.schema: a JSON schema object is required",
                               "invalid_schema", "response_format")
            chosen.append(("response_format", _schema_grammar(schema, "response_format")))
        else:
            raise ApiError(400, f"response_format.type {kind!r} is not supported (text, json_object, json_schema)",
                           "unsupported_parameter", "response_format")
    choice = request.tool_choice
    tools = request.tool_dicts()
    if forces_call(request):
        names = [t["function"]["name"] for t in tools]
        if choice == "required":
            wanted = names
        elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            wanted = [choice["function"].get("name")]
        else:
            raise ApiError(400, f"tool_choice {choice!r} is not supported (auto, none, required, or "
                                '{"type": "function", "function": {"name": ...}})', "unsupported_parameter",
                           "tool_choice")
        if not wanted or any(name not in names for name in wanted):
            raise ApiError(400, f"tool_choice names {wanted!r}, which is not among the declared tools {names!r}",
                           "invalid_tool_choice", "tool_choice")
        chosen.append(("tool_choice", _tool_call_grammar(tools, wanted, call_format)))
    if request.grammar:
        chosen.append(("grammar", request.grammar))
    if len(chosen) > 1:
        raise ApiError(400, f"{' and '.join(name for name, _ in chosen)} each constrain the reply; send one",
                       "conflicting_constraints", chosen[1][0])
    return chosen[0][1] if chosen else None
