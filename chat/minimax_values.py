"""MiniMax-M3's argument values: XML elements named by their keys, each tag after the
namespace token, expanded recursively by the template's `to_xml` macro.

    ]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<tags>
    ]<]minimax[>[<item>a]<]minimax[>[</item>]<]minimax[>[</tags>

As llama.cpp reads them (common/parsers/minimax-m3.cpp, its `value_of` / `members_of`):
a value whose schema may be a string is raw text up to its closing tag (a union with a
string alternative too, even when the text looks structured); an object with properties
is its members as elements, required ones first (llama.cpp: in schema order; here in any
order), then optional ones in any order; an array is `<item>` elements; a union is the
choice of its alternatives; anything else is JSON text matching its schema.
`minimax_json` reads a call's elements into JSON by the tool's schema (without one,
elements are objects, `<item>`s arrays, other text JSON where it parses, else a
string); `MinimaxValues` writes the grammar.
"""

from __future__ import annotations

import json
from typing import Any

from chat.callformat import excluding
from chat.gbnf import RuleSet, literal
from chat.schema import SchemaConverter
from chat.tagged_args import MAX_PERMUTE, value_types

NS = "]<]minimax[>["
ITEM = "item"


class MinimaxSyntaxError(ValueError):
    """Text that is not the elements the schema asks for."""


def close_tag(key: str) -> str:
    return f"{NS}</{key}>"


def _deref(schema: Any, root: Any, seen: frozenset[str] = frozenset()) -> Any:
    """The schema a `$ref` points to (None: unresolvable or recursive)."""
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen or not ref.startswith("#/"):
            return None
        seen, node = seen | {ref}, root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        schema = node
    return schema


def _kind(schema: Any, root: Any) -> str:
    """How llama.cpp writes a value of `schema`: string, union, object, array or json."""
    if schema is None or "string" in value_types(schema, root):
        return "string"
    if any(k in schema for k in ("anyOf", "oneOf")):
        return "union"
    if isinstance(schema.get("properties"), dict) and schema["properties"]:
        return "object"
    if schema.get("type") == "array" and "items" in schema:
        return "array"
    return "json"


class MinimaxValues:
    """Adds rules for M3 elements of JSON schemas to a RuleSet."""

    def __init__(self, rules: RuleSet, root: Any, prefix: str):
        self.rules, self.root, self.prefix = rules, root, prefix
        self._converter = SchemaConverter(rules, root, prefix)
        self._texts: dict[str, str] = {}  # closing tag -> the rule for text without it

    def members(self, schema: dict[str, Any], name: str) -> str:
        """An object's members: the required ones in any order (llama.cpp asks for the
        schema's order, which the memoized tools, keyed with sorted keys, no longer hold;
        past MAX_PERMUTE of them, sorted), then optional ones in any order."""
        required = set(schema.get("required") or ())
        req: list[str] = []
        opt: list[str] = []
        ws = self.rules.primitive("ws")
        for key, sub in schema["properties"].items():
            element = self.element(key, sub, f"{name}-{key}")
            (req if key in required else opt).append(element)
        if len(req) > MAX_PERMUTE:
            head = f" {ws} ".join(req)
        else:
            head = self._any_order(req, name, (1 << len(req)) - 1) if req else ""
        tail = f"({ws} ({' | '.join(opt)}))*" if opt else ""
        return f"{head} {tail}".strip() or '""'

    def _any_order(self, items: list[str], name: str, mask: int) -> str:
        """The `items` in `mask`, each once, in any order."""
        left = [i for i in range(len(items)) if mask & (1 << i)]
        if len(left) == 1:
            return items[left[0]]
        ws = self.rules.primitive("ws")
        alternatives = [f"{items[i]} {ws} {self._any_order(items, name, mask & ~(1 << i))}"
                        for i in left]  # fmt: skip
        return self.rules.add(f"{name}-any-{mask}", " | ".join(alternatives))

    def element(self, key: str, schema: Any, name: str) -> str:
        body = f"{literal(f'{NS}<{key}>')} {self.value(schema, name, close_tag(key))}"
        return self.rules.add(name, body)

    def value(self, schema: Any, name: str, close: str) -> str:
        schema = _deref(schema, self.root)
        kind = _kind(schema, self.root)
        ws = self.rules.primitive("ws")
        if kind == "string":
            return f"{self._text(close)} {literal(close)}"
        if kind == "union":
            alternatives = schema.get("anyOf") or schema.get("oneOf")
            choices = [self.value(a, f"{name}-{i}", close) for i, a in enumerate(alternatives)]
            return "(" + " | ".join(choices) + ")"
        if kind == "object":
            return f"{self.members(schema, name)} {ws} {literal(close)}"
        if kind == "array":
            item = self.element(ITEM, schema["items"], f"{name}-item")
            return f"({ws} {item})* {ws} {literal(close)}"
        return f"{self._converter.convert(schema, name)} {literal(close)}"

    def _text(self, close: str) -> str:
        """Text that cannot hold `close` (llama.cpp's `until`), one rule set per tag."""
        if close not in self._texts:
            self._texts[close] = excluding(self.rules, f"{self.prefix}text", close)
        return self._texts[close]


class _Reader:
    """Reads elements from one call's text, by the schema where there is one."""

    def __init__(self, text: str, root: Any):
        self.text, self.root, self.pos = text, root, 0

    def skip_blank(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def open_tag(self) -> str | None:
        """The key of the element opening here (the position moves past it), or None."""
        self.skip_blank()
        head = NS + "<"
        if not self.text.startswith(head, self.pos) or self.text.startswith(NS + "</", self.pos):
            return None
        end = self.text.find(">", self.pos + len(head))
        if end < 0:
            raise MinimaxSyntaxError("an unclosed tag")
        key = self.text[self.pos + len(head) : end]
        self.pos = end + 1
        return key

    def expect(self, close: str) -> None:
        self.skip_blank()
        if not self.text.startswith(close, self.pos):
            raise MinimaxSyntaxError(f"expected {close!r}")
        self.pos += len(close)

    def members(self, schema: Any) -> dict[str, Any]:
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        out: dict[str, Any] = {}
        while (key := self.open_tag()) is not None:
            sub = props.get(key) if isinstance(props, dict) and props else None
            out[key] = self.value(sub, close_tag(key), known=bool(props))
        return out

    def value(self, schema: Any, close: str, known: bool = True) -> Any:
        schema = _deref(schema, self.root) if known else None
        kind = _kind(schema, self.root) if schema is not None else "free"
        if kind == "union":
            start = self.pos
            for alternative in schema.get("anyOf") or schema.get("oneOf"):
                try:
                    return self.value(alternative, close)
                except MinimaxSyntaxError:
                    self.pos = start
            raise MinimaxSyntaxError("no alternative of the union matches")
        if kind == "free":  # no schema: the text's own shape decides
            head = self.text[self.pos :].lstrip()
            kind = ("array" if head.startswith(f"{NS}<{ITEM}>") else
                    "object" if head.startswith(NS + "<") and not head.startswith(close)
                    else "scalar")  # fmt: skip
        if kind == "object":
            out = self.members(schema)
            self.expect(close)
            return out
        if kind == "array":
            items = []
            item_schema = schema.get("items") if isinstance(schema, dict) else None
            while self.open_tag() == ITEM:
                items.append(self.value(item_schema, close_tag(ITEM), known=schema is not None))
            self.expect(close)
            return items
        end = self.text.find(close, self.pos)
        if end < 0:
            raise MinimaxSyntaxError(f"no {close!r}")
        raw, self.pos = self.text[self.pos : end], end + len(close)
        if kind == "string":
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            if kind == "scalar":
                return raw
            raise MinimaxSyntaxError(f"not JSON: {raw!r}") from None


def minimax_json(body: str, schema: Any) -> dict[str, Any]:
    """A call's elements (the text between its `<invoke ..>` and `</invoke>`) as the JSON
    object of its arguments, typed by the tool's parameters `schema` (None: not offered)."""
    reader = _Reader(body, schema)
    out = reader.members(schema)
    reader.skip_blank()
    if reader.pos != len(body):
        raise MinimaxSyntaxError(f"text after the arguments: {body[reader.pos :]!r}")
    return out
