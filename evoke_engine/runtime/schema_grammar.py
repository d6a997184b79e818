"""Strict `json_schema` to GBNF: llama-cpp-python's converter, taught integer bounds, and a check that refuses what
no grammar of it would enforce.

Invariants: every keyword of the schema is either enforced by the grammar (`ENFORCED`), an annotation that never
constrains a value (`ANNOTATIONS`, and keywords unknown to JSON Schema: vendor extensions), or refused with a
`SchemaRefused` naming it and where it sits (`REFUSED`); an integer's `minimum`/`maximum`/`exclusiveMinimum`/
`exclusiveMaximum` become a grammar of exactly the integers in range, in JSON's form (no leading zeros, no "-0").
"""

from __future__ import annotations

import json
import math
from typing import Any

ENFORCED = ("type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
            "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "minLength",
            "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
ANNOTATIONS = ("title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "format", "strict", "discriminator", "nullable")
REFUSED = ("multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
           "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "if",
           "then", "else", "not", "unevaluatedProperties", "unevaluatedItems", "contentEncoding", "contentMediaType",
           "contentSchema", "$dynamicRef", "$recursiveRef")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


class SchemaRefused(ValueError):
    """A keyword the grammar cannot enforce: `keyword` and `where` (a JSON pointer) name it."""

    def __init__(self, keyword: str, where: str, why: str) -> None:
        super().__init__(f"{keyword} at {where or '/'}: {why}")
        self.keyword, self.where = keyword, where


def check_schema(schema: Any, where: str = "") -> None:
    """Raise `SchemaRefused` for the first keyword of `schema` (or its subschemas) the grammar would not enforce."""
    if not isinstance(schema, dict):
        return
    for keyword in schema:
        if keyword in REFUSED:
            raise SchemaRefused(keyword, where, "the grammar that constrains the reply cannot enforce it")
    bounds = [k for k in BOUNDS if k in schema]
    if bounds and schema.get("type") != "integer":
        raise SchemaRefused(bounds[0], where, "bounds are enforced for \"type\": \"integer\" only (not for "
                                              f"{json.dumps(schema.get('type'))})")
    if bounds:
        integer_range(schema, where)                    # refuses bounds no integer meets
    for key in _SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            check_schema(sub, f"{where}/{key}/{name}")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            check_schema(sub, f"{where}/{key}/{i}")
    items = schema.get("items")
    for i, sub in enumerate(items if isinstance(items, list) else [items]):
        check_schema(sub, f"{where}/items" + (f"/{i}" if isinstance(items, list) else ""))
    check_schema(schema.get("additionalProperties"), f"{where}/additionalProperties")


def integer_range(schema: dict, where: str = "") -> tuple[int | None, int | None]:
    """(lowest, highest) integer the schema's bounds allow (None: unbounded); draft-4 boolean exclusives too."""
    low = high = None
    for keyword in BOUNDS:
        value = schema.get(keyword)
        if value is None or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaRefused(keyword, where, f"{value!r} is not a finite number")
    if (value := schema.get("minimum")) is not None:
        low = math.floor(value) + 1 if schema.get("exclusiveMinimum") is True and value == math.floor(value) \
            else math.ceil(value)
    if (value := schema.get("exclusiveMinimum")) is not None and not isinstance(value, bool):
        low = max(low if low is not None else -math.inf, math.floor(value) + 1)
    if (value := schema.get("maximum")) is not None:
        high = math.ceil(value) - 1 if schema.get("exclusiveMaximum") is True and value == math.ceil(value) \
            else math.floor(value)
    if (value := schema.get("exclusiveMaximum")) is not None and not isinstance(value, bool):
        high = min(high if high is not None else math.inf, math.ceil(value) - 1)
    low, high = (None if low is None else int(low)), (None if high is None else int(high))
    if low is not None and high is not None and low > high:
        raise SchemaRefused("minimum" if "minimum" in schema else "exclusiveMinimum", where,
                            "no integer lies within the bounds")
    return low, high


# -- integers in a range as GBNF -------------------------------------------------------------------------------------
def _same_length(low: str, high: str) -> list[str]:
    """GBNF sequences for the digit strings of one length from `low` to `high` (inner digits may be 0)."""
    if low == high:
        return [" ".join(f'"{d}"' for d in low)]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    rest = len(low) - 1
    if low[0] == high[0]:
        return [f'"{low[0]}" {tail}' for tail in _same_length(low[1:], high[1:])]
    out = [f'"{low[0]}" {tail}' for tail in _same_length(low[1:], "9" * rest)]
    if int(low[0]) + 1 <= int(high[0]) - 1:
        out.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}]" + " [0-9]" * rest)
    out += [f'"{high[0]}" {tail}' for tail in _same_length("0" * rest, high[1:])]
    return out


def _natural(low: int, high: int | None) -> list[str]:
    """Alternatives for the integers low..high (low >= 0; high None: no upper bound), without leading zeros."""
    out: list[str] = []
    top_digits = len(str(high)) if high is not None else len(str(low))
    for digits in range(len(str(low)), top_digits + 1):
        first = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        last = min(high, 10 ** digits - 1) if high is not None else 10 ** digits - 1
        if first <= last:
            out += _same_length(str(first), str(last))
    if high is None:                                    # every longer number
        out.append("[1-9]" + " [0-9]" * top_digits + " [0-9]*")
    return out


def integer_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression matching exactly the JSON integers in [low, high] (either end may be open)."""
    parts: list[str] = []
    if low is None or low < 0:                          # negatives: "-" and their magnitudes
        magnitude_low = 1 if high is None or high >= 0 else -high
        magnitude_high = None if low is None else -low
        parts += [f'"-" ({alt})' for alt in _natural(magnitude_low, magnitude_high)]
    if high is None or high >= 0:
        parts += [f"({alt})" for alt in _natural(max(low or 0, 0), high)]
    return " | ".join(parts)


def schema_grammar(schema: dict) -> str:
    """The GBNF of a strict `json_schema` (`SchemaRefused` for what it cannot enforce; the converter's own
    exceptions for schemas it cannot read)."""
    from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

    class BoundedConverter(SchemaConverter):
        def visit(self, sub, name):
            if isinstance(sub, dict) and sub.get("type") == "integer" and any(k in sub for k in BOUNDS):
                rule_name = name + "-" if name in RESERVED_NAMES else name or "root"     # as the converter names
                return self._add_rule(rule_name, f"({integer_rule(*integer_range(sub))}) space")
            return super().visit(sub, name)

    check_schema(schema)
    converter = BoundedConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return converter.format_grammar()
