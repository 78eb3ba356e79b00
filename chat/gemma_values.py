"""Gemma 4's argument values: not JSON, but the syntax its template writes calls in.

    {city:<|"|>London<|"|>,days:3,opts:{metric:true},tags:[<|"|>a<|"|>,<|"|>b<|"|>]}

Strings sit between `<|"|>` tokens (no escapes: a string ends at the next `<|"|>`), keys
are bare, numbers, `true`/`false`/`null` as in JSON, no blanks (the template's
`format_argument`). `gemma_json` reads such a value into JSON (llama.cpp's
`gemma4_to_json`, common/chat-peg-parser.cpp); `GemmaValues` writes a grammar for the
values a JSON schema admits.

The grammar is kvserve's own, stricter than llama.cpp's (which admits any Gemma dict for
every tool, its parsers/gemma4.cpp says so in a TODO): an object's keys are its schema's
properties, in sorted order (the template writes arguments `dictsort`ed, so a call
sampled under the grammar renders back to the same text when the client sends it back),
the required ones present; strings, numbers, booleans, enums and arrays typed. A schema
part it cannot type (a $ref cycle, a pattern, `additionalProperties` beside properties)
admits any Gemma value there.

A string holds no `<|` (the start of the closing `<|"|>` and of every Gemma marker: a
value that comes close to one, as SmolLM2's `<|"|",properties:...`, is the model
running on past the value, not a value), and its length is the schema's minLength and
maxLength (within chat.gbnf's `bounds`, as the JSON converter's), counted in characters.
"""

from __future__ import annotations

import json
from typing import Any

from chat.callformat import excluding
from chat.gbnf import RuleSet, bounds, literal

QUOTE = '<|"|>'
_MARKER = "<|"  # what no string value holds (see the module doc)
_SCALARS = {"integer": "integer", "number": "number", "boolean": "boolean", "null": "null"}


class GemmaValues:
    """Adds rules for Gemma-syntax values of JSON schemas to a RuleSet."""

    def __init__(self, rules: RuleSet):
        self.rules = rules
        self.root: Any = None
        self.prefix = ""
        self._refs: set[str] = set()
        self._any: tuple[str, str] | None = None  # (value, dict) rules, once written
        self._strings: dict[tuple[int, int | None], str] = {}  # (low, high) -> its rule

    def arguments(self, schema: Any, prefix: str) -> str:
        """A rule for a call's arguments (a dict), of the parameters `schema`; `prefix`
        keeps this tool's rule names apart."""
        self.root, self.prefix = schema, prefix
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            return self._object(schema, "args")  # no properties: `{}` only
        return self.any_dict()

    def value(self, schema: Any, name: str) -> str:
        if not isinstance(schema, dict):
            return self.any_value()
        if "$ref" in schema:
            ref = schema["$ref"]
            target = _resolve(self.root, ref)
            if target is None or ref in self._refs:  # unresolvable or recursive
                return self.any_value()
            self._refs.add(ref)
            try:
                return self.value(target, name)
            finally:
                self._refs.discard(ref)
        if "const" in schema:
            return _rendered(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(_rendered(v) for v in schema["enum"]) + ")"
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list) and branches:
            return "(" + " | ".join(self.value(b, f"{name}-{i}")
                                    for i, b in enumerate(branches)) + ")"  # fmt: skip
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return "(" + " | ".join(self.value({**schema, "type": k}, f"{name}-{k}")
                                    for k in kind) + ")"  # fmt: skip
        if kind == "object" or (kind is None and "properties" in schema):
            if isinstance(schema.get("properties"), dict):
                return self._object(schema, name)
            return self.any_dict()
        if kind == "array":
            return self._array(schema, name)
        if kind == "string":
            return self.string(schema)
        if kind in _SCALARS:
            return self.rules.primitive(_SCALARS[kind])
        return self.any_value()

    def string(self, schema: Any = None) -> str:
        """A string value: its text between quotes (`schema`: its length bounds)."""
        low, high = 0, None
        if isinstance(schema, dict):
            low = int(schema.get("minLength", 0))
            high = int(schema["maxLength"]) if schema.get("maxLength") is not None else None
        low, high = bounds(low, high, self.rules.spent)
        if (low, high) not in self._strings:
            self.rules.spent += max(low, high or 0)
            if high is None and low == 0:
                text = excluding(self.rules, "gemma-text", _MARKER)
            else:
                text = self._bounded_text(low, high)
            body = f"{literal(QUOTE)} {text} {literal(QUOTE)}"
            self._strings[low, high] = self.rules.add("gemma-string", body)
        return self._strings[low, high]

    def _bounded_text(self, low: int, high: int | None) -> str:
        """Text of low..high characters without `<|` (high None: at least low): the
        two states of `excluding`'s automaton for it (the last character is `<` or not)
        times the characters written so far (after `low` of them unbounded, where high
        is None), so the count is in characters."""
        low = low if high is None else min(low, high)  # a schema that no string meets
        top = low if high is None else high
        plain = [self.rules.reserve(f"gemma-text-{low}-{high}-p{i}") for i in range(top + 1)]
        after = [self.rules.reserve(f"gemma-text-{low}-{high}-q{i}") for i in range(top + 1)]
        tail = excluding(self.rules, "gemma-text", _MARKER) if high is None else ""
        for i in range(top + 1):
            if i < top:
                end = ['""'] if i >= low else []
                self.rules.define(plain[i], " | ".join([*end, f"[^<] {plain[i + 1]}",
                                                        f'"<" {after[i + 1]}']))  # fmt: skip
                self.rules.define(after[i], " | ".join([*end, f"[^<|] {plain[i + 1]}",
                                                        f'"<" {after[i + 1]}']))  # fmt: skip
            elif tail:  # low written, then any more: `excluding`'s rule, from its state
                self.rules.define(plain[i], tail)
                self.rules.define(after[i], f'"" | [^<|] {tail} | "<" {after[i]}')
            else:
                self.rules.define(plain[i], '""')
                self.rules.define(after[i], '""')
        return plain[0]

    def any_value(self) -> str:
        """Any Gemma value (llama.cpp's `gemma4-value`)."""
        if self._any is not None:
            return self._any[0]
        value = self.rules.reserve("gemma-value")
        key = self.rules.add("gemma-key", '[^:{}\\[\\],<"]+')
        kv = f'{key} ":" {value}'
        dict_ = self.rules.add("gemma-dict", f'"{{" ({kv} ("," {kv})*)? "}}"')
        array = self.rules.add("gemma-array", f'"[" ({value} ("," {value})*)? "]"')
        scalars = " | ".join(self.rules.primitive(p) for p in ("number", "boolean", "null"))
        self.rules.define(value, f"{self.string()} | {dict_} | {array} | {scalars}")
        self._any = (value, dict_)
        return value

    def any_dict(self) -> str:
        self.any_value()
        assert self._any is not None
        return self._any[1]

    def _array(self, schema: Any, name: str) -> str:
        item = self.value(schema.get("items", True), f"{name}-item")
        body = f'"[" ({item} ("," {item})*)? "]"'
        if schema.get("minItems", 0) >= 1:
            body = f'"[" {item} ("," {item})* "]"'
        return self.rules.add(f"{self.prefix}{name}", body)

    def _object(self, schema: dict[str, Any], name: str) -> str:
        """The properties in sorted order, each required one present: `start_i` is what
        may come when none of the properties before i was written, `after_i` once one
        was (so a comma goes before the next)."""
        properties = sorted(schema["properties"].items())
        required = set(schema.get("required") or ())
        base = f"{self.prefix}{name}"
        start, after = '""', '""'
        for i in range(len(properties) - 1, -1, -1):
            key, sub = properties[i]
            kv = f"{literal(key + ':')} {self.value(sub, f'{name}-{i}')}"
            if key in required:
                start = self.rules.add(f"{base}-s{i}", f"{kv} {after}")
                after = self.rules.add(f"{base}-a{i}", f'"," {kv} {after}')
            else:
                start = self.rules.add(f"{base}-s{i}", f"{kv} {after} | {start}")
                after = self.rules.add(f"{base}-a{i}", f'"," {kv} {after} | {after}')
        return self.rules.add(base, f'"{{" {start} "}}"')


def _rendered(value: Any) -> str:
    """A literal matching `value` as the template's `format_argument` writes it."""
    return literal(_render(value))


def _render(value: Any) -> str:
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_render(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return json.dumps(value)


def _resolve(root: Any, ref: str) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class GemmaSyntaxError(ValueError):
    """The text is not a Gemma value."""


def gemma_json(text: str) -> Any:
    """The JSON value of the Gemma-syntax `text` (blanks between items and quoted keys
    are read too, `None`/`True`/`False` as null/true/false)."""
    reader = _Reader(text)
    value = reader.value()
    reader.blank()
    if reader.at != len(text):
        raise GemmaSyntaxError(f"text after the value at {reader.at}")
    return value


_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def blank(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def value(self) -> Any:
        self.blank()
        text = self.text
        if text.startswith(QUOTE, self.at):
            return self._string()
        if text.startswith("{", self.at):
            return self._items("}", keyed=True)
        if text.startswith("[", self.at):
            return self._items("]", keyed=False)
        end = self.at
        while end < len(text) and text[end] not in ",}]" and not text[end].isspace():
            end += 1
        word, self.at = text[self.at : end], end
        if word in _WORDS:
            return _WORDS[word]
        try:
            number = json.loads(word)
        except ValueError:
            raise GemmaSyntaxError(f"not a value: {word!r}") from None
        if not isinstance(number, int | float):
            raise GemmaSyntaxError(f"not a value: {word!r}")
        return number

    def _string(self) -> str:
        start = self.at + len(QUOTE)
        end = self.text.find(QUOTE, start)
        if end < 0:
            raise GemmaSyntaxError("a string is not closed")
        self.at = end + len(QUOTE)
        return self.text[start:end]

    def _items(self, close: str, keyed: bool) -> Any:
        self.at += 1
        out: Any = {} if keyed else []
        self.blank()
        if self.text.startswith(close, self.at):
            self.at += 1
            return out
        while True:
            if keyed:
                key = self._key()
                out[key] = self.value()
            else:
                out.append(self.value())
            self.blank()
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            if self.text.startswith(close, self.at):
                self.at += 1
                return out
            raise GemmaSyntaxError(f"expected ',' or {close!r} at {self.at}")

    def _key(self) -> str:
        self.blank()
        if self.text.startswith(QUOTE, self.at):
            key = self._string()
            self.blank()
        else:
            end = self.text.find(":", self.at)
            if end < 0:
                raise GemmaSyntaxError("a key has no ':'")
            key = self.text[self.at : end].strip()
            self.at = end
        if not self.text.startswith(":", self.at):
            raise GemmaSyntaxError(f"expected ':' at {self.at}")
        self.at += 1
        return key
