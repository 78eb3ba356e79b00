"""JSON schema -> GBNF: the rules produced and the schemas refused.

(Every grammar here is also compiled by the real llama.cpp in
tests/integration/test_structured.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.gbnf import RuleSet
from chat.regex import PatternError, pattern_to_gbnf
from chat.schema import SchemaError, schema_to_gbnf
from tests.chat.gbnf_check import accepts

SCHEMAS: list[Any] = [
    True,
    {},
    {"type": "string"},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email"},
    {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
    {"type": "string", "pattern": "\\d{3}"},
    {"type": "string", "pattern": "^[^\"\\\\]{1,4}\\s\\w?$"},
    {"type": ["string", "null"]},
    {"type": "integer", "minimum": 1, "maximum": 6},
    {"type": "integer", "minimum": 0},
    {"type": "number", "minimum": -5, "maximum": 5},
    {"type": "boolean"},
    {"enum": ["a", 1, None, {"k": [True]}]},
    {"const": "fixed"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "maxItems": 0},
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
     "additionalProperties": True},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"type": "null"}}}]},
    {"oneOf": [{"const": 1}, {"const": 2}]},
    {"$defs": {"tree": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
        "required": ["v"]}}, "$ref": "#/$defs/tree"},
    {"definitions": {"p": {"type": "string"}}, "type": "object",
     "properties": {"p": {"$ref": "#/definitions/p"}}},
    # accepted; enforced in part or not at all (the README lists which)
    {"type": "string", "pattern": "(?=x)"},
    {"type": "string", "pattern": "a*?"},
    {"type": "string", "pattern": "(a)\\1"},
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 2},
    {"not": {"type": "string"}},
    {"allOf": [{"type": "string"}]},
    {"type": "array", "prefixItems": [{"type": "string"}]},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": False},
    {"type": "array", "uniqueItems": True, "items": {"type": "integer", "multipleOf": 3}},
    {"type": "object", "propertyNames": {"maxLength": 3}, "minProperties": 1,
     "additionalProperties": {"type": "integer"}},
]  # fmt: skip


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_schemas_convert(schema: Any) -> None:
    grammar = schema_to_gbnf(schema)
    assert grammar.startswith("root ::= ")
    names = {line.split(" ::= ")[0] for line in grammar.splitlines()}
    assert len(names) == len(grammar.splitlines())  # every rule defined once


def test_object_rules_follow_required_and_order() -> None:
    g = schema_to_gbnf(
        {
            "type": "object",
            "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
            "required": ["b"],
        }  # fmt: skip
    )
    root = next(line for line in g.splitlines() if line.startswith("root-value ::="))
    assert root.index('"\\"b\\""') < root.index('"\\"a\\""')  # required first
    assert '("," ' not in root or "?" in root


def test_small_integer_ranges_are_enumerated() -> None:
    assert '"1" | "2" | "3"' in schema_to_gbnf({"type": "integer", "minimum": 1, "maximum": 3})


@pytest.mark.parametrize(("schema", "any_keys"), [
    ({"type": "object", "properties": {}}, False),  # a tool without parameters: only {}
    ({"properties": {}}, False),
    ({"type": "object", "additionalProperties": False}, False),
    ({"type": "object", "properties": {}, "additionalProperties": True}, True),
    ({"type": "object"}, True),  # no properties, no additionalProperties: any object
    ({"type": "object", "additionalProperties": {}}, True),
])  # fmt: skip
def test_extra_keys_follow_llama_cpp(schema: dict[str, Any], any_keys: bool) -> None:
    """As llama.cpp's json_schema_to_grammar: `properties` given and `additionalProperties`
    absent means no keys beyond the named ones; only an object schema with neither (or
    additionalProperties true or a schema) lets the model add keys."""
    g = schema_to_gbnf(schema)
    root = next(line for line in g.splitlines() if line.startswith("root-value ::="))
    assert ("root-value-kv" in root) is any_keys, g
    if not any_keys:
        assert root == 'root-value ::= "{" ws  ws "}"'  # exactly {}
    named = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "null"}}})
    assert "-kv" not in named and '"\\"a\\""' in named


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "https://example.com/schema"},
        {"$ref": "#/$defs/missing"},
        {"type": "objekt"},
        {"type": "object", "required": ["x"], "additionalProperties": False},
    ],
)
def test_invalid_or_unresolvable_schemas_raise(schema: Any) -> None:
    with pytest.raises(SchemaError):
        schema_to_gbnf(schema)


def test_pattern_expression() -> None:
    assert pattern_to_gbnf("^ab$", RuleSet()) == '"ab"'
    assert pattern_to_gbnf("a", RuleSet()) == 'char* "a" char*'  # search semantics
    assert pattern_to_gbnf("^a\\$", RuleSet()) == '"a$" char*'  # an escaped $ is no anchor
    with pytest.raises(PatternError):
        pattern_to_gbnf("(?=x)x", RuleSet())


def test_pattern_characters_json_escapes_are_written_escaped() -> None:
    """A quote or a control character the pattern allows is matched as its JSON escape
    (the grammar is for the JSON text between the quotes)."""
    grammar = schema_to_gbnf({"type": "string", "pattern": '^say "[^"]*"\\s$'})
    assert accepts(grammar, json.dumps('say "hi"\n')) and accepts(grammar, json.dumps('say ""\t'))
    assert not accepts(grammar, json.dumps('say "a"b"\n')) and not accepts(grammar, '"say ""')


# What Pydantic emits for a tuple, a set and a discriminated union (pydantic 2.x).
PYDANTIC_SCHEMA: Any = {
    "$defs": {
        "Cat": {"properties": {"kind": {"const": "cat", "title": "Kind", "type": "string"},
                               "lives": {"title": "Lives", "type": "integer", "multipleOf": 1}},
                "required": ["kind", "lives"], "title": "Cat", "type": "object"},
        "Dog": {"properties": {"kind": {"const": "dog", "title": "Kind", "type": "string"},
                               "good": {"title": "Good", "type": "boolean"}},
                "required": ["kind", "good"], "title": "Dog", "type": "object"},
    },
    "properties": {
        "point": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "number"},
                  {"type": "number"}], "title": "Point", "type": "array"},
        "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array",
                 "uniqueItems": True},
        "pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
                                  "propertyName": "kind"},
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"},
    },
    "required": ["point", "tags", "pet"], "title": "Args", "type": "object",
}  # fmt: skip


def test_pydantic_tuple_set_and_discriminated_union_convert() -> None:
    grammar = schema_to_gbnf(PYDANTIC_SCHEMA)
    point = next(line for line in grammar.splitlines() if line.startswith("root-value-point ::="))
    assert point.count("root-value-point-0") == 2 and "*" not in point  # two numbers, no more
    assert "def-cat ::=" in grammar and "def-dog ::=" in grammar


# Claude Code 2.1's `Read` tool (captured; descriptions cut): `$schema`, and integers
# bounded by JavaScript's Number.MAX_SAFE_INTEGER.
READ_SCHEMA: Any = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
    "properties": {
        "file_path": {"description": "The absolute path to the file to read", "type": "string"},
        "offset": {"description": "The line number to start reading from.", "type": "integer",
                   "minimum": 0, "maximum": 9007199254740991},
        "limit": {"description": "The number of lines to read.", "type": "integer",
                  "exclusiveMinimum": 0, "maximum": 9007199254740991},
        "pages": {"description": "Page range for PDF files.", "type": "string"},
        "allow_large": {"description": "Read a file over the usual size limits.",
                        "type": "boolean"},
    },
    "required": ["file_path"], "additionalProperties": False,
}  # fmt: skip


def test_claude_code_read_schema_with_huge_integer_bounds() -> None:
    grammar = schema_to_gbnf(READ_SCHEMA)
    assert len(grammar) < 2000  # no digit-range rules built from the bounds
    # (required first, then the canonical (sorted) order of the memo key)
    good = {"file_path": "/a.py", "allow_large": True, "limit": 1, "offset": 9007199254740991}
    assert accepts(grammar, json.dumps(good))
    assert accepts(grammar, json.dumps({"file_path": "/a.py", "offset": 0}))
    for bad in ({"file_path": "/a.py", "offset": -1}, {"file_path": "/a.py", "limit": 0},
                {"offset": 3}, {"file_path": "/a.py", "extra": 1}):  # fmt: skip
        assert not accepts(grammar, json.dumps(bad)), bad


def test_huge_and_signed_bounds_convert() -> None:
    both = schema_to_gbnf({"type": "integer", "minimum": -9007199254740991,
                           "maximum": 9007199254740991})  # fmt: skip
    assert accepts(both, "-9007199254740991") and not accepts(both, "1.5")
    near = schema_to_gbnf({"type": "integer", "minimum": 9007199254740900,
                           "maximum": 9007199254740991})  # few values: enumerated  # fmt: skip
    assert accepts(near, "9007199254740991") and not accepts(near, "9007199254740899")
    assert accepts(schema_to_gbnf({"type": "number", "maximum": 1e308}), "-2.5")


@pytest.mark.parametrize("keyword", [
    {"encrypted": True}, {"x-vendor": {"any": "thing"}}, {"$comment": "why"},
    {"examples": ["a"]}, {"deprecated": True}, {"readOnly": True}, {"markdownDescription": "x"},
])  # fmt: skip
def test_unknown_and_annotation_keywords_are_ignored(
    keyword: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """As llama.cpp's converter (and JSON Schema): a keyword that is not read changes
    nothing; one kvserve does not know is logged."""
    schema = {"type": "object", "properties": {"s": {"type": "string", **keyword}},
              "required": ["s"]}  # fmt: skip
    plain = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    with caplog.at_level("INFO", logger="kvserve.chat"):
        assert schema_to_gbnf(schema) == schema_to_gbnf(plain)
    unknown = next(iter(keyword)) in ("encrypted", "x-vendor", "markdownDescription")
    assert (next(iter(keyword)) in caplog.text) is unknown


def test_draft4_boolean_exclusive_bounds() -> None:
    grammar = schema_to_gbnf({"$schema": "http://json-schema.org/draft-04/schema#",
                              "type": "integer", "minimum": 0, "exclusiveMinimum": True,
                              "maximum": 3, "exclusiveMaximum": True})  # fmt: skip
    assert [accepts(grammar, str(n)) for n in range(5)] == [False, True, True, False, False]
    assert accepts(schema_to_gbnf({"type": "integer", "exclusiveMinimum": 0.5}), "1")
