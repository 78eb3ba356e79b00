"""GLM 4.5 / 4.6 / 4.7's tagged calls, each argument a key and a value:

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

(GLM 4.7 Flash writes the same tags without the newlines). The templates write a string
value as its text and any other value as JSON (`v | tojson if v is not string`), so a
value is typed back as Qwen3-Coder's XML values are (chat/formats_xml.py `value_json`):
raw text where the schema admits only strings, else JSON when it parses as a type the
schema admits. Required arguments come first in any order, then optional ones (as in
chat/formats_xml.py). In `required` / named mode the grammar lets the thinking come
first (GLM 4.7 opens `<think>` in the prompt; GLM 4.6 writes it itself).
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
from chat.formats_xml import ALL_TYPES, MAX_PERMUTE, value_json, value_types
from chat.gbnf import RuleSet, literal
from chat.schema import SchemaConverter, SchemaError
from chat.tools import INPUT, ChatInputError, Tool, ToolChoice

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@dataclass(frozen=True, slots=True)
class GlmFormat:
    name: str
    nl: str  # "\n" after the name and each tag pair (GLM 4.5/4.6), "" (GLM 4.7 Flash)
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
        return GlmParser(tools)


GLM_45 = GlmFormat("glm-4.5", "\n")
GLM_47 = GlmFormat("glm-4.7", "")


def detect_glm(source: str) -> GlmFormat | None:
    """`<tool_call>` with `<arg_key>` / `<arg_value>` tags (also Ling 3, Spark 2.5 and
    Poolside Laguna); the newline form when the template writes a newline after the
    key's end tag (itself, or `\\n` in a string), else the compact one."""
    if not all(tag in source for tag in (OPEN, KEY, VALUE)):
        return None
    return GLM_45 if KEY_END + "\n" in source or KEY_END + "\\n" in source else GLM_47


def _grammar(fmt: GlmFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        if tool.grammar is not None:  # the input as raw text, held to its grammar
            opener = literal(f"{KEY}{INPUT}{KEY_END}{fmt.nl}{VALUE}")
            text = input_grammar(rules, i, tool.grammar, json_text=False)
            args = f"{opener} {text} {literal(VALUE_END + fmt.nl)}"
        else:
            try:
                args = _arguments(rules, fmt, tool.parameters, f"t{i}-")
            except SchemaError as exc:
                raise ChatInputError(str(exc), param=f"tools[{i}].function.parameters") from None
        head = literal(OPEN + tool.name + fmt.nl)
        alternatives.append(rules.add(f"call-{i}", f"{head} {args} {literal(CLOSE)}".strip()))
    call = rules.add("call", " | ".join(alternatives))
    sep = f"{literal(fmt.nl)} " if fmt.nl else ""
    calls = f"{call} ({sep}{call})*" if parallel else call
    if mode == "auto" and not doc_key:
        pattern = rf"[\s\S]*?({re.escape(OPEN)})[\s\S]*"
        return GrammarSpec(rules.text(calls), lazy=True, trigger_patterns=(pattern,))
    thinking = excluding(rules, "thinking", "</think>")
    think = rules.add("think", f'"\\n"? "<think>"? {thinking} "</think>" "\\n"?')
    answer = rules.add("calls", calls)
    if doc_key:  # auto with a response schema: calls, or the document
        answer = f"({answer} | {document_rule(rules, doc_key)})"
    return GrammarSpec(rules.text(f"({think})? {answer}"))


def _arguments(rules: RuleSet, fmt: GlmFormat, parameters: Any, prefix: str) -> str:
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(parameters.get("required") or ())
    converter = SchemaConverter(rules, parameters, prefix)
    req: list[str] = []
    opt: list[str] = []
    for pname, pschema in props.items():
        if "string" in value_types(pschema, parameters):
            if "glm-text-0" not in rules.rules:
                excluding(rules, "glm-text", VALUE_END)
            value = "glm-text-0"
        else:
            value = converter.convert(pschema, f"arg-{pname}")
        head = literal(f"{KEY}{pname}{KEY_END}{fmt.nl}{VALUE}")
        arg = rules.add(f"{prefix}arg", f"{head} {value} {literal(VALUE_END + fmt.nl)}")
        (req if pname in required else opt).append(arg)
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


class GlmParser:
    """Splits output into content and calls, incrementally; text that may still open a
    call is held back, each argument's value is typed once it closes."""

    def __init__(self, tools: Sequence[Tool]):
        self._types = {
            t.name: {
                k: value_types(v, t.parameters)
                for k, v in ((t.parameters or {}).get("properties") or {}).items()
            }
            for t in tools
            if isinstance(t.parameters, dict)
        }
        self._buf = ""
        self._state = "text"  # text | name | args | key | value
        self._name = self._key = ""
        self._num_args = 0
        self._between = False
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._step(out):
            pass
        return [d for d in out if d.text or d.kind == "start"]

    def finish(self) -> list[Delta]:
        out = [Delta("content", self._buf)] if self._state == "text" and self._buf else []
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "text":
            return self._text(out)
        if self._state == "name":
            ends = [at for at in (self._buf.find(c) for c in ("\n", KEY, CLOSE)) if at >= 0]
            if not ends:
                return False
            self._name, self._buf = self._buf[: min(ends)].strip(), self._buf[min(ends) :]
            out.append(Delta("start", self._name, self.num_calls, new_call_id()))
            out.append(Delta("args", "{", self.num_calls))
            self._state, self._num_args = "args", 0
            return True
        if self._state == "args":
            return self._args(out)
        end = KEY_END if self._state == "key" else VALUE_END
        at = self._buf.find(end)
        if at < 0:
            return False
        text, self._buf = self._buf[:at], self._buf[at + len(end) :]
        if self._state == "key":
            self._key, self._state = text.strip(), "args"
        else:
            self._add_arg(text, out)
            self._state = "args"
        return True

    def _text(self, out: list[Delta]) -> bool:
        if self._between:  # the newline between calls is no content
            self._buf = self._buf.lstrip()
            self._between = not self._buf
            if self._between:
                return False
        at = self._buf.find(OPEN)
        if at >= 0:
            out.append(Delta("content", self._buf[:at]))
            self._buf, self._state = self._buf[at + len(OPEN) :], "name"
            return True
        keep = next((k for k in range(min(len(OPEN) - 1, len(self._buf)), 0, -1)
                     if OPEN.startswith(self._buf[-k:])), 0)  # fmt: skip
        out.append(Delta("content", self._buf[: len(self._buf) - keep]))
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _args(self, out: list[Delta]) -> bool:
        self._buf = self._buf.lstrip()
        for tag, state in ((KEY, "key"), (VALUE, "value")):
            if self._buf.startswith(tag):
                self._buf, self._state = self._buf[len(tag) :], state
                return True
        if self._buf.startswith(CLOSE):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._buf, self._state, self._between = self._buf[len(CLOSE) :], "text", True
            return True
        if not self._buf or any(t.startswith(self._buf) for t in (KEY, VALUE, CLOSE)):
            return False
        self._buf = self._buf[1:]  # stray text inside a call (no grammar held it): skipped
        return True

    def _add_arg(self, text: str, out: list[Delta]) -> None:
        types = self._types.get(self._name, {}).get(self._key, ALL_TYPES)
        head = ", " if self._num_args else ""
        self._num_args += 1
        piece = f"{head}{json.dumps(self._key, ensure_ascii=False)}: {value_json(text, types)}"
        out.append(Delta("args", piece, self.num_calls))
