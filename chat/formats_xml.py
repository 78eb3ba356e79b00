"""Qwen3-Coder's XML calls (also Qwen3.5, Nemotron 3 Nano, StepFun 3.5 Flash):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

As llama.cpp reads them (common/parsers/qwen3-coder.cpp): a parameter whose schema
admits only strings is raw text; one that admits no string is JSON matching its schema;
one that admits a string and other types is JSON when it parses as one of those other
types, else the raw text (the grammar keeps only the raw-text form there). Required
parameters come first in any order, then optional ones. Qwen3-Coder (the template
without `<think>`) sometimes leaves out the first call's `<tool_call>`: the grammar
allows that and a `<function=NAME>` of an offered tool also arms the lazy grammar.
A tool with an input grammar (a custom tool) takes its one string parameter as raw text
held to that grammar; the grammar cannot also keep `\n</parameter>\n` out of it, so an
input holding that line would end at it when parsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import (
    CallParser,
    GrammarSpec,
    document_key,
    document_rule,
    excluding,
    input_grammar,
    keyed_tools,
    memo_grammar,
    tools_key,
)
from chat.callstream import Delta, new_call_id
from chat.gbnf import RuleSet, literal
from chat.schema import SchemaConverter, SchemaError
from chat.tools import INPUT, ChatInputError, Tool, ToolChoice

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION = "<function="
VALUE_END = "\n</parameter>\n"
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
class XmlFormat:
    name: str
    bare_first: bool  # the first call may come without its <tool_call> (Qwen3-Coder)
    native: bool = True
    owns_reasoning: bool = False

    def grammar(
        self, tools: list[Tool], choice: ToolChoice, parallel: bool, document: Any = None
    ) -> GrammarSpec:
        key, doc = tools_key(tools), document_key(document, choice)
        return memo_grammar(
            f"{self.name}|{choice.mode}|{parallel}|{key}|{doc}",
            lambda: _grammar(self, key, choice.mode, parallel, doc),
        )

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return XmlCallParser(self, tools)


QWEN3_CODER = XmlFormat("qwen3-coder", bare_first=True)
QWEN3_XML = XmlFormat("qwen3-xml", bare_first=False)  # the thinking templates


def detect_xml(source: str) -> XmlFormat | None:
    """llama.cpp's rule (common/chat.cpp): `<tool_call>`, `<function=` and `<parameter=`
    in the template, except templates that write `<tool_call><function=` without the
    newlines between them."""
    if not all(tag in source for tag in (OPEN, FUNCTION, "<parameter=")):
        return None
    if "'<tool_call><function=' ~ tool_call.name ~ '>'" in source:
        return None
    return QWEN3_XML if "<think>" in source else QWEN3_CODER


def _grammar(fmt: XmlFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    close = literal(VALUE_END)
    names = []
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        names.append(tool.name)
        if tool.grammar is not None:  # the input as raw text, held to its grammar
            opener = literal(f"<parameter={INPUT}>\n")
            args = f"{opener} {input_grammar(rules, i, tool.grammar, json_text=False)} {close}"
        else:
            try:
                args = _arguments(rules, tool.parameters, f"t{i}-", close)
            except SchemaError as exc:
                raise ChatInputError(str(exc), param=f"tools[{i}].function.parameters") from None
        head, tail = literal(f"{FUNCTION}{tool.name}>\n"), literal("</function>\n")
        alternatives.append(rules.add(f"call-{i}", " ".join(p for p in (head, args, tail) if p)))
    opener = literal(OPEN + "\n")
    body = rules.add("call-body", f"({' | '.join(alternatives)}) {literal(CLOSE)} {ws}")
    call = rules.add("call", f"{opener} {body}")
    first = rules.add("call-first", f"({opener})? {body}") if fmt.bare_first else call
    root = f"{first} {call}*" if parallel else first
    lazy = mode == "auto"
    if doc_key:  # calls | the document: no longer free text, so not lazy
        value = document_rule(rules, doc_key)
        root, lazy = f"({root}) | {value}", False
    starts = [OPEN] + ([f"{FUNCTION}{n}>" for n in names] if fmt.bare_first else [])
    patterns = tuple(rf"[\s\S]*?({re.escape(s)})[\s\S]*" for s in starts)
    return GrammarSpec(rules.text(root), lazy=lazy, trigger_patterns=patterns if lazy else ())


def _arguments(rules: RuleSet, parameters: Any, prefix: str, close: str) -> str:
    """Required parameters in any order (llama.cpp's `permute`), then optional ones."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(parameters.get("required") or ())
    converter = SchemaConverter(rules, parameters, prefix)
    req: list[str] = []
    opt: list[str] = []
    for pname, pschema in props.items():
        if "string" in value_types(pschema, parameters):
            value = rules.add("xml-arg-string", f"{_raw_text(rules)} {close}")
        else:
            value = f"{converter.convert(pschema, f'arg-{pname}')} {close}"
        opener = literal(f"<parameter={pname}>\n")
        (req if pname in required else opt).append(rules.add(f"{prefix}arg", f"{opener} {value}"))
    if len(req) > MAX_PERMUTE:
        head = " ".join(req)
    else:
        head = _permute(rules, req, prefix, (1 << len(req)) - 1) if req else ""
    tail = f"({' | '.join(opt)})*" if opt else ""
    return f"{head} {tail}".strip()


def _permute(rules: RuleSet, items: list[str], prefix: str, mask: int) -> str:
    left = [i for i in range(len(items)) if mask & (1 << i)]
    if len(left) == 1:
        return items[left[0]]
    alternatives = [f"{items[i]} {_permute(rules, items, prefix, mask & ~(1 << i))}" for i in left]
    return rules.add(f"{prefix}args-{mask}", " | ".join(alternatives))


def _raw_text(rules: RuleSet) -> str:
    if "xml-arg-text-0" not in rules.rules:
        excluding(rules, "xml-arg-text", VALUE_END)
    return "xml-arg-text-0"


class XmlCallParser:
    """Splits output into content and XML calls, incrementally. Text that may still
    open a call is held back; each parameter's value is typed once it closes."""

    def __init__(self, fmt: XmlFormat, tools: Sequence[Tool]):
        self._types = {
            t.name: {
                k: value_types(v, t.parameters)
                for k, v in ((t.parameters or {}).get("properties") or {}).items()
            }
            for t in tools
            if isinstance(t.parameters, dict)
        }
        starts = [OPEN] + ([f"{FUNCTION}{t.name}>" for t in tools] if fmt.bare_first else [])
        self._starts = starts
        self._buf = ""
        self._state = "text"  # text | open | params | value | close
        self._name = ""
        self._param = ""
        self._num_args = 0
        self._between = False
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._step(out):
            pass
        return [d for d in out if d.text or d.kind == "start"]

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state == "text" and self._buf:
            out.append(Delta("content", self._buf))
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self._state == "text":
            return self._scan_text(out)
        if self._state in ("open", "params", "close"):
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
        if self._state == "open":
            return self._open(out)
        if self._state == "params":
            return self._params(out)
        if self._state == "value":
            at = self._buf.find(VALUE_END)
            if at < 0:
                return False
            self._add_arg(self._buf[:at], out)
            self._buf, self._state = self._buf[at + len(VALUE_END) :], "params"
            return True
        if self._buf.startswith(CLOSE):  # close: after </function>
            self._buf, self._state, self._between = self._buf[len(CLOSE) :], "text", True
            return True
        if CLOSE.startswith(self._buf):
            return False
        self._state = "text"  # no </tool_call>: what follows is text again
        return True

    def _scan_text(self, out: list[Delta]) -> bool:
        if self._between:  # the blank after a call (the grammar's `ws`) is no content
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._between = False
        found = [(self._buf.find(s), s) for s in self._starts if s in self._buf]
        if found:
            at, start = min(found)
            out.append(Delta("content", self._buf[:at]))
            skip = len(start) if start == OPEN else 0  # a bare <function=...> is the call
            self._buf, self._state = self._buf[at + skip :], "open"
            return True
        keep = max(
            (k for s in self._starts for k in range(1, min(len(s), len(self._buf) + 1))
             if s.startswith(self._buf[-k:])),
            default=0,
        )  # fmt: skip
        out.append(Delta("content", self._buf[: len(self._buf) - keep]))
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _open(self, out: list[Delta]) -> bool:
        if not self._buf.startswith(FUNCTION):
            if FUNCTION.startswith(self._buf):
                return False
            out.append(Delta("content", OPEN))  # not a call after all
            self._state = "text"
            return True
        end = self._buf.find(">")
        if end < 0:
            return False
        self._name = self._buf[len(FUNCTION) : end].strip()
        self._buf, self._state, self._num_args = self._buf[end + 1 :], "params", 0
        out.append(Delta("start", self._name, self.num_calls, new_call_id()))
        out.append(Delta("args", "{", self.num_calls))
        return True

    def _params(self, out: list[Delta]) -> bool:
        if self._buf.startswith("</function>"):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._buf, self._state = self._buf[len("</function>") :], "close"
            return True
        if self._buf.startswith("<parameter="):
            end = self._buf.find(">")
            if end < 0:
                return False
            self._param = self._buf[len("<parameter=") : end].strip()
            rest = self._buf[end + 1 :]
            if not rest:
                return False  # the newline after the tag is not the value's: wait for it
            self._buf, self._state = rest[1:] if rest.startswith("\n") else rest, "value"
            return True
        if "</function>".startswith(self._buf) or "<parameter=".startswith(self._buf):
            return False
        self._buf = self._buf[1:]  # stray text inside a call (no grammar held it): skipped
        return True

    def _add_arg(self, text: str, out: list[Delta]) -> None:
        types = self._types.get(self._name, {}).get(self._param, ALL_TYPES)
        head = ", " if self._num_args else ""
        self._num_args += 1
        piece = f"{head}{json.dumps(self._param, ensure_ascii=False)}: {value_json(text, types)}"
        out.append(Delta("args", piece, self.num_calls))
