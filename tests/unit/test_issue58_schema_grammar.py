"""Issue 58 item 5 on plain objects: the integers a bounded integer's grammar accepts are exactly those in range
(checked against every integer near the bounds, through a regex made from the GBNF), and keywords no grammar
enforces are refused by name."""

from __future__ import annotations

import re

import pytest

from evoke_engine.runtime.schema_grammar import SchemaRefused, check_schema, integer_range, integer_rule, schema_grammar


def as_regex(gbnf: str) -> re.Pattern:
    """The GBNF expression `integer_rule` writes (literals, classes, groups, |, *) as a regular expression."""
    pattern = re.sub(r'"(.)"', lambda m: re.escape(m.group(1)), gbnf).replace(" ", "")
    return re.compile(f"(?:{pattern})")


@pytest.mark.parametrize(("low", "high"), [(100, 105), (0, 0), (-5, 5), (-120, -7), (7, 1234), (0, 99), (-1, 0),
                                           (5, None), (None, 5), (None, -13), (-13, None), (None, None), (98, 102)])
def test_a_bounded_integer_matches_exactly_its_range(low, high):
    matcher = as_regex(integer_rule(low, high))
    for n in range(-1500, 1500):
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert bool(matcher.fullmatch(str(n))) == inside, (low, high, n)
    for bad in ("-0", "007", "01", "+5", ""):
        assert not matcher.fullmatch(bad)
    if high is None:
        assert matcher.fullmatch("123456789012")


def test_bounds_are_read_as_json_schema_writes_them():
    assert integer_range({"type": "integer", "minimum": 100, "maximum": 105}) == (100, 105)
    assert integer_range({"type": "integer", "exclusiveMinimum": 100, "exclusiveMaximum": 105}) == (101, 104)
    assert integer_range({"type": "integer", "minimum": 2.5, "maximum": 7.5}) == (3, 7)
    assert integer_range({"type": "integer", "minimum": 1, "exclusiveMinimum": True}) == (2, None)    # draft 4
    with pytest.raises(SchemaRefused, match="no integer"):
        integer_range({"type": "integer", "minimum": 5, "maximum": 4})


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": 1}}}, "minimum"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}, "not"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer",
                                                                                  "multipleOf": 2}}}, "multipleOf"),
])
def test_what_the_grammar_cannot_enforce_is_refused_by_name(schema, keyword):
    with pytest.raises(SchemaRefused) as refused:
        check_schema(schema)
    assert refused.value.keyword == keyword


def test_a_schema_with_bounds_and_annotations_converts():
    grammar = schema_grammar({"type": "object", "title": "T", "properties": {
        "n": {"type": "integer", "minimum": 100, "maximum": 105, "description": "a number"},
        "integer": {"type": "integer", "exclusiveMaximum": 0}}, "required": ["n", "integer"]})
    assert '"1" "0" [0-5]' in grammar.replace("(", "").replace(")", "") and "root ::=" in grammar
