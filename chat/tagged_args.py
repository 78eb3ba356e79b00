"""Arguments written as tagged key / value text rather than as one JSON object (Qwen3-Coder's
`<parameter=KEY>VALUE</parameter>`, GLM's `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>`):
their grammar and how each value's text is typed back into JSON.

As llama.cpp reads them (common/parsers/qwen3-coder.cpp; GLM's templates write values the
same way, `v | tojson if v is not string`): a parameter whose schema admits only strings
is raw text; one that admits no string is JSON matching its schema; one that admits a
string and other types is JSON when it parses as one of those other types, else the raw
text (the grammar keeps only the raw-text form there). Required parameters come first
in any order, then optional ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import KeyedTool, excluding, input_grammar, keyed_tools
from chat.gbnf import RuleSet
from chat.schema import SchemaConverter, SchemaError
from chat.tools import INPUT, ChatInputError, Tool

MAX_PERMUTE = 6  # llama.cpp's COMMON_CHAT_MAX_PERMUTE: past it, required in schema order
ALL_TYPES = frozenset(("string", "number", "integer", "boolean", "null", "array", "object"))


def value_types(schema: Any, root: Any, seen: frozenset[str] = frozenset()) -> frozenset[str]:
    """The JSON types a parameter's schema admits (llama.cpp's `value_types`)."""
    if schema is True or schema == {} or not isinstance(schema, dict):
        return ALL_TYPES if schema is not False else frozenset()
    if "$ref" in schema:
        ref = schema["$ref"]
        target = _resolve(root, ref)
        return frozenset() if ref in seen or target is None else value_types(
            target, root, seen | {ref})  # fmt: skip
    if "const" in schema:
        return frozenset((_json_type(schema["const"]),))
    if "enum" in schema:
        return frozenset(_json_type(v) for v in schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return frozenset().union(*(value_types(s, root, seen) for s in schema[union]))
    if "allOf" in schema:
        out = ALL_TYPES
        for part in schema["allOf"]:
            out &= value_types(part, root, seen)
        return out
    kind = schema.get("type")
    if kind is not None:
        kinds = {kind} if isinstance(kind, str) else set(kind)
        return frozenset(kinds | ({"integer"} if "number" in kinds else set()))
    if "properties" in schema or "additionalProperties" in schema:
        return frozenset(("object",))
    if "items" in schema or "prefixItems" in schema:
        return frozenset(("array",))
    return ALL_TYPES


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#/") or not isinstance(root, dict):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_PYTHON_WORDS = {"True": True, "False": False, "None": None}  # as `|string` renders them


def value_json(text: str, types: frozenset[str]) -> str:
    """A parameter's raw text as the JSON value llama.cpp's parser makes of it."""
    if types == {"string"}:
        return json.dumps(text, ensure_ascii=False)
    try:
        value = _PYTHON_WORDS[text] if text in _PYTHON_WORDS else json.loads(text)
    except ValueError:
        return json.dumps(text, ensure_ascii=False)  # not JSON: the text it is
    kind = _json_type(value)
    allowed = types - {"string"}
    if "string" in types and kind == "string":
        return json.dumps(text, ensure_ascii=False)  # '"x"' for a string stays its text
    if "string" in types and not (kind in allowed or (kind == "integer" and "number" in allowed)):
        return json.dumps(text, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Tags:
    """How a format writes one argument: `param(key, value)` its tags around the GBNF
    `value`; a value written as raw text ends at `value_end`, which the text cannot hold
    (`text_rule`: the name of those rules, one set per grammar). `string_text`, where
    a format has one: its rule for a value whose schema admits a string, given that
    schema (None: the raw-text rule)."""

    param: Callable[[str, str], str]
    value_end: str
    text_rule: str
    string_text: Callable[[RuleSet, Any], str | None] | None = None


def tagged_calls(
    rules: RuleSet, key: str, tags: Tags, parts: Callable[[str, str], Sequence[str]]
) -> str:
    """A rule for one call of any tool `key` holds (`keyed_tools`): tool i's `call-i` is
    the GBNF `parts` writes from its name and its `tagged_arguments`, the empty ones left
    out (a tool without parameters has no arguments)."""
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args = tagged_arguments(rules, i, tool, tags)
        body = " ".join(p for p in parts(tool.name, args) if p)
        alternatives.append(rules.add(f"call-{i}", body))
    return rules.add("call", " | ".join(alternatives))


def tagged_arguments(rules: RuleSet, i: int, tool: KeyedTool, tags: Tags) -> str:
    """Tool `i`'s arguments, each value the rule of its JSON or, for a schema that admits
    a string, raw text. A tool with an input grammar takes its one string parameter as
    raw text held to that grammar."""
    if tool.grammar is not None:
        return tags.param(INPUT, input_grammar(rules, i, tool.grammar, json_text=False))
    try:
        return _parameters(rules, tool.parameters, f"t{i}-", tags)
    except SchemaError as exc:
        raise ChatInputError(str(exc), param=f"tools[{i}].function.parameters") from None


def _parameters(rules: RuleSet, parameters: Any, prefix: str, tags: Tags) -> str:
    """Required parameters in any order (llama.cpp's `permute`), then optional ones."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(parameters.get("required") or ())
    converter = SchemaConverter(rules, parameters, prefix)
    req: list[str] = []
    opt: list[str] = []
    for key, schema in props.items():
        if "string" in value_types(schema, parameters):
            own = tags.string_text(rules, schema) if tags.string_text else None
            value = own or _raw_text(rules, tags)
        else:
            value = converter.convert(schema, f"arg-{key}")
        (req if key in required else opt).append(rules.add(f"{prefix}arg", tags.param(key, value)))
    if len(req) > MAX_PERMUTE:
        head = " ".join(req)
    else:
        head = _permute(rules, req, prefix, (1 << len(req)) - 1) if req else ""
    tail = f"({' | '.join(opt)})*" if opt else ""
    return f"{head} {tail}".strip()


def _raw_text(rules: RuleSet, tags: Tags) -> str:
    """The rule for text without the value's end, written once however many use it."""
    name = f"{tags.text_rule}-0"
    return name if name in rules.rules else excluding(rules, tags.text_rule, tags.value_end)


def _permute(rules: RuleSet, items: list[str], prefix: str, mask: int) -> str:
    left = [i for i in range(len(items)) if mask & (1 << i)]
    if len(left) == 1:
        return items[left[0]]
    alternatives = [f"{items[i]} {_permute(rules, items, prefix, mask & ~(1 << i))}" for i in left]
    return rules.add(f"{prefix}args-{mask}", " | ".join(alternatives))


class TypedArgs:
    """One call's arguments, a tagged value at a time, as the text of the JSON object they
    stand for: each value typed by its offered tool's schema (any type for a tool or a
    parameter that is not offered). `text_if_string`: a value whose schema admits a
    string is that string, whatever it looks like (MiniCPM5's handler reads it so)."""

    def __init__(self, tools: Sequence[Tool], text_if_string: bool = False):
        self._text_if_string = text_if_string
        self._types = {
            t.name: {
                k: value_types(v, t.parameters)
                for k, v in ((t.parameters or {}).get("properties") or {}).items()
            }
            for t in tools
            if isinstance(t.parameters, dict)
        }
        self._tool = ""
        self._count = 0

    def open(self, tool: str) -> str:
        """A call to `tool` begins: the object's opening."""
        self._tool, self._count = tool, 0
        return "{"

    def add(self, key: str, text: str) -> str:
        """The object's text for the argument `key` written as `text`."""
        types = self._types.get(self._tool, {}).get(key, ALL_TYPES)
        if self._text_if_string and "string" in types:
            types = frozenset(("string",))
        head = ", " if self._count else ""
        self._count += 1
        return f"{head}{json.dumps(key, ensure_ascii=False)}: {value_json(text, types)}"
