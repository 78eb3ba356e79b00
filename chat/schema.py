"""JSON schema -> GBNF, our own converter (chat/ cannot import llama_cpp).

Enforced: object (properties, required, additionalProperties false/true/schema), array
(items, prefixItems / tuple-form items, minItems, maxItems), string (enum, const,
minLength, maxLength, format date/time/date-time/uuid, pattern: see chat.regex),
number/integer, boolean, null, enum/const of any JSON value, anyOf/oneOf, allOf (merged),
type lists, $ref to #/$defs and #/definitions.

Accepted but NOT enforced (valid JSON Schema the grammar cannot express; agents' schemas
carry them, Pydantic emits several for everyday types): `NOT_ENFORCED` below, a pattern
the regex subset cannot express (any string), a pattern's length bounds, `discriminator`
(an annotation beside oneOf). A keyword kvserve does not know is ignored (logged), as
JSON Schema reads an unknown keyword (an annotation) and as llama.cpp's converter does:
Codex's `"encrypted": true`, vendors' `x-*`. Only a schema that is not valid JSON Schema,
or a $ref that cannot be resolved locally, raises SchemaError.

Choices made so the output is always valid *and* bounded:
- Properties come out in the schema's order, required ones first. A missing
  `additionalProperties` is treated as false when `properties` is given, even empty (the
  model cannot invent keys; the output still validates, since extra keys would have been
  allowed), as llama.cpp's json_schema_to_grammar does: `{"type": "object",
  "properties": {}}`, the schema of a tool without parameters, allows only `{}`. An
  object schema with neither keyword allows any object.
- Number bounds: integers with both bounds and at most 256 values are enumerated, and
  `minimum >= 0` (or 1 for integers) forbids the sign (and zero). Other bounds are NOT
  enforced by the grammar (accepted, since agents' tool schemas carry them; the README
  says so), however large (Claude Code's `maximum: 9007199254740991`): unlike
  llama.cpp's converter, no digit-range rules are built from them.
- Length and count bounds (minLength/maxLength, minItems/maxItems, a pattern's `{m,n}`)
  past what llama.cpp can write out become unbounded repetitions (chat.gbnf `bounds`,
  docs/tools.md "Large bounds"): never a refusal of a valid schema.
- `oneOf` is treated as `anyOf`: exclusivity is not enforced.
- `allOf` branches are merged into one schema (properties and required united).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import jsonschema

from chat.gbnf import RuleSet, json_literal, literal
from chat.memo import ByteMemo
from chat.regex import PatternError, pattern_to_gbnf

log = logging.getLogger("kvserve.chat")


class SchemaError(ValueError):
    """The schema is invalid or uses something the converter does not support."""


# Keywords that only annotate: ignored (and any other keyword, with a log line).
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict", "nullable",
}  # fmt: skip
_SUPPORTED = {
    "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "enum", "const", "minLength", "maxLength", "format", "pattern", "anyOf",
    "oneOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "prefixItems", "additionalItems", "allOf", "discriminator",
}  # fmt: skip
# Valid keywords the grammar does not enforce (listed in the README).
NOT_ENFORCED = {
    "uniqueItems", "multipleOf", "propertyNames", "patternProperties", "minProperties",
    "maxProperties", "not", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "contentEncoding", "contentMediaType", "contentSchema", "$anchor",
    "$dynamicAnchor", "$vocabulary",
}  # fmt: skip
_FORMATS = {"date": '"\\"" date "\\""', "time": '"\\"" time "\\""', "uuid": '"\\"" uuid "\\""'}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_MAX_ENUMERATED = 256


def check_schema(schema: Any) -> None:
    """Raise SchemaError unless `schema` is a valid JSON schema (any draft)."""
    if not isinstance(schema, dict | bool):
        raise SchemaError("a JSON schema must be an object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"invalid JSON schema: {exc.message}") from None


class SchemaConverter:
    """Adds rules for one or more schemas to a RuleSet; `prefix` keeps names apart."""

    def __init__(self, rules: RuleSet, root_schema: Any, prefix: str = ""):
        self.rules = rules
        self.root = root_schema
        self.prefix = prefix
        self._refs: dict[str, str] = {}
        self._ignored: set[str] = set()

    def convert(self, schema: Any, name: str = "value") -> str:
        """A rule name matching the JSON text of instances of `schema`."""
        rule = self._rule(schema, name)
        if self._ignored:
            log.info("JSON schema keyword(s) %s ignored (unknown: annotations)",
                     ", ".join(sorted(self._ignored)))  # fmt: skip
            self._ignored.clear()
        return rule

    def _rule(self, schema: Any, name: str) -> str:
        expr = self._expr(schema, name)
        return self.rules.add(self.prefix + name, expr)

    def _expr(self, schema: Any, name: str) -> str:
        if schema is True or schema == {}:
            return self.rules.primitive("value")
        if schema is False:
            raise SchemaError(f"'{name}' admits no value (schema false)")
        if not isinstance(schema, dict):
            raise SchemaError(f"'{name}': a schema must be an object or a boolean")
        self._ignored |= set(schema) - _SUPPORTED - _ANNOTATIONS - NOT_ENFORCED
        if "allOf" in schema:
            return self._expr(_merged(schema), name)
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return json_literal(schema["const"])
        if "enum" in schema:
            return " | ".join(json_literal(v) for v in schema["enum"]) or '""'
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                branches = [{**rest, **b} if isinstance(b, dict) else b for b in schema[key]]
                return " | ".join(self._rule(b, f"{name}-{i}") for i, b in enumerate(branches))
        types = schema.get("type")
        if types is None:
            types = self._infer_type(schema)
        if isinstance(types, list):
            return (
                " | ".join(self._rule({**schema, "type": t}, f"{name}-{t}") for t in types) or '""'
            )
        if types not in _TYPES:
            raise SchemaError(f"unknown type {types!r} at '{name}'")
        return getattr(self, f"_{types}")(schema, name)  # type: ignore[no-any-return]

    @staticmethod
    def _infer_type(schema: dict[str, Any]) -> str | list[str]:
        if "properties" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        if {"minLength", "maxLength", "pattern", "format"} & set(schema):
            return "string"
        return list(_TYPES)

    def _ref(self, ref: str) -> str:
        for base in ("#/$defs/", "#/definitions/"):
            if isinstance(ref, str) and ref.startswith(base):
                key = ref[len(base) :]
                break
        else:
            raise SchemaError(f"unsupported $ref {ref!r}: only #/$defs/... and #/definitions/...")
        if ref not in self._refs:
            defs = self.root.get(base[2:-1], {}) if isinstance(self.root, dict) else {}
            if key not in defs:
                raise SchemaError(f"$ref {ref!r} names no definition")
            # Reserve the name first: a definition may refer to itself.
            name = self.rules.reserve(self.prefix + "def-" + key)
            self._refs[ref] = name
            self.rules.define(name, self._expr(defs[key], "def-" + key))
        return self._refs[ref]

    def _object(self, schema: dict[str, Any], name: str) -> str:
        ws = self.rules.primitive("ws")
        props: dict[str, Any] = schema.get("properties", {})
        required = [p for p in schema.get("required", []) if p in props]
        missing = [p for p in schema.get("required", []) if p not in props]
        # As llama.cpp's converter: `properties` given (even empty: a tool that takes no
        # arguments) and no `additionalProperties` means no other keys; neither: any object.
        extra = schema.get("additionalProperties", None if "properties" in schema else True)
        if missing:  # a grammar cannot force a key it does not know
            raise SchemaError(f"'{name}' requires {missing}, which it does not define")
        optional = [p for p in props if p not in required]
        kv = {
            p: f'{literal(json.dumps(p))} {ws} ":" {ws} {self._rule(props[p], f"{name}-{p}")}'
            for p in props
        }
        if extra not in (None, False):
            value = self._rule(extra if isinstance(extra, dict) else True, f"{name}-extra")
            more = self.rules.add(
                f"{name}-kv", f'{self.rules.primitive("string")} {ws} ":" {ws} {value}'
            )
            optional.append("")  # any number of extra members, after the named ones
            kv[""] = f'{more} ({ws} "," {ws} {more})*'
        sep = f'{ws} "," {ws}'
        head = f" {sep} ".join(kv[p] for p in required)
        if head:
            tail = " ".join(f"({sep} {kv[p]})?" for p in optional)
            return f'"{{" {ws} {head} {tail} {ws} "}}"'
        # No required member: the first present optional one has no comma before it. The
        # members that may follow member i are one rule (`rest`), so the text grows with
        # the number of members, not its square (llama.cpp also refuses a group holding
        # over 2000 rules: some 60 optional members written out inline).
        rest = [""] * (len(optional) + 1)
        for i in range(len(optional) - 1, 0, -1):
            body = f"({sep} {kv[optional[i]]})? {rest[i + 1]}".rstrip()
            rest[i] = self.rules.add(f"{self.prefix}{name}-rest", body)
        starts = [f"{kv[p]} {rest[i + 1]}".rstrip() for i, p in enumerate(optional)]
        body = f"({' | '.join(f'({s})' for s in starts)})?" if starts else ""
        return f'"{{" {ws} {body} {ws} "}}"'

    def _array(self, schema: dict[str, Any], name: str) -> str:
        ws = self.rules.primitive("ws")
        items = schema.get("items", True)
        prefix: list[Any] = schema.get("prefixItems", [])
        if isinstance(items, list):  # the tuple form of drafts before 2020-12
            prefix, items = items, schema.get("additionalItems", True)
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if prefix:
            return self._tuple(prefix, items, low, high, name)
        item = self._rule(items, f"{name}-item")
        if high is not None and high < max(low, 1):
            return f'"[" {ws} "]"' if high == 0 else '""'
        more = f'{ws} "," {ws} {item}'
        more_high = None if high is None else high - 1
        rest = self.rules.repeat(f"{self.prefix}{name}-more", more, max(low - 1, 0), more_high)
        body = f"{item} {rest}"
        return f'"[" {ws} {body if low else f"({body})?"} {ws} "]"'

    def _tuple(self, prefix: list[Any], items: Any, low: int, high: Any, name: str) -> str:
        """Positional items first (all of them, unless maxItems cuts them short: an array
        may be shorter than its prefix, but never needs to be), then the rest."""
        ws = self.rules.primitive("ws")
        count = len(prefix) if high is None else min(len(prefix), high)
        parts = [self._rule(p, f"{name}-{i}") for i, p in enumerate(prefix[:count])]
        body = f' {ws} "," {ws} '.join(parts)
        more_high = None if high is None else high - count
        if items is not False and more_high != 0 and count == len(prefix):
            item = self._rule(items, f"{name}-item")
            more = f'{ws} "," {ws} {item}'
            low_more = max(low - count, 0)
            extra = self.rules.repeat(f"{self.prefix}{name}-more", more, low_more, more_high)
            body = f"{body} {extra}" if body else f"({item} {extra})?"
        return f'"[" {ws} {body} {ws} "]"'

    def _string(self, schema: dict[str, Any], name: str) -> str:
        fmt = schema.get("format")
        if "pattern" in schema:
            try:  # the pattern is enforced; length bounds beside it are not
                self.rules.primitive("string")
                return f'"\\"" {pattern_to_gbnf(schema["pattern"], self.rules)} "\\""'
            except PatternError:  # beyond the regex subset: not enforced (see module doc)
                schema = {k: v for k, v in schema.items() if k != "pattern"}
        if fmt == "date-time":
            self.rules.primitive("date"), self.rules.primitive("time")
            return '"\\"" date "T" time "\\""'
        if fmt in _FORMATS:
            self.rules.primitive(fmt)
            return _FORMATS[fmt]
        # Other formats are annotations (validators do not enforce them by default).
        char = self.rules.primitive("char")
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        if low == 0 and high is None:
            return self.rules.primitive("string")
        return f'"\\"" {self.rules.repeat(f"{self.prefix}{name}-chars", char, low, high)} "\\""'

    def _integer(self, schema: dict[str, Any], name: str) -> str:
        low, high = self._bounds(schema, integer=True)
        if low is not None and high is not None and high - low < _MAX_ENUMERATED:
            return " | ".join(f'"{v}"' for v in range(int(low), int(high) + 1)) or '""'
        # Only the sign (and zero) is enforced beyond this; see the module doc.
        if low is not None and low >= 1:
            return "[1-9] [0-9]{0,15}"
        if low is not None and low >= 0:
            return '"0" | [1-9] [0-9]{0,15}'
        return self.rules.primitive("integer")

    def _number(self, schema: dict[str, Any], name: str) -> str:
        low, _ = self._bounds(schema, integer=False)
        if low is not None and low >= 0:  # only the sign is enforced; see the module doc
            return '("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})?'
        return self.rules.primitive("number")

    @staticmethod
    def _bounds(schema: dict[str, Any], integer: bool) -> tuple[Any, Any]:
        low, high = schema.get("minimum"), schema.get("maximum")
        exclusive = schema.get("exclusiveMinimum")
        if isinstance(exclusive, bool):  # draft 4: the minimum itself is excluded
            exclusive = low if exclusive else None
        if exclusive is not None:
            # For numbers this errs towards allowing the bound itself (unenforced).
            bound = exclusive // 1 + 1 if integer else exclusive
            low = bound if low is None else max(low, bound)
        ex_high = schema.get("exclusiveMaximum")
        if isinstance(ex_high, bool):  # draft 4, as above
            ex_high = high if ex_high else None
        if isinstance(ex_high, int | float):
            bound = -(-ex_high // 1) - 1 if integer else ex_high
            high = bound if high is None else min(high, bound)
        if integer:
            low = None if low is None else -(-low // 1)
            high = None if high is None else high // 1
        return low, high

    def _boolean(self, schema: dict[str, Any], name: str) -> str:
        return self.rules.primitive("boolean")

    def _null(self, schema: dict[str, Any], name: str) -> str:
        return self.rules.primitive("null")


def _merged(schema: dict[str, Any]) -> Any:
    """An allOf folded into one schema: properties and required united, other keywords
    from later branches winning (exact for the object shapes generators emit)."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for branch in schema["allOf"]:
        if branch is False:
            return False
        if not isinstance(branch, dict):
            continue
        for key, value in branch.items():
            if key == "properties":
                out["properties"] = {**out.get("properties", {}), **value}
            elif key == "required":
                out["required"] = [*out.get("required", []), *value]
            else:
                out[key] = value
    return out


_GRAMMARS: ByteMemo[str] = ByteMemo(16 << 20, len)  # canonical schema -> GBNF


def _schema_gbnf(canonical: str) -> str:
    schema = json.loads(canonical)
    check_schema(schema)
    rules = RuleSet()
    return rules.text(SchemaConverter(rules, schema).convert(schema, "root-value"))


def schema_to_gbnf(schema: Any) -> str:
    """A complete grammar (root = one instance of `schema`). Memoized (bounded by
    bytes): agents resend the same schema with every turn, keyed by its canonical JSON."""
    canonical = json.dumps(schema, sort_keys=True)
    return _GRAMMARS.get(canonical, lambda: _schema_gbnf(canonical))


def json_object_gbnf() -> str:
    rules = RuleSet()
    return rules.text(rules.primitive("object"))
