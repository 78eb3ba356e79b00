"""LFM2 / LFM2.5: a Python-style list of calls between `<|tool_call_start|>` and
`<|tool_call_end|>`; thinking in `<think>` (LFM2.5-8B-A1B), split by the plan.

    <|tool_call_start|>[get_time(city="Paris"), toggle(enabled=True)]<|tool_call_end|>

As llama.cpp reads it (common/parsers/lfm2.cpp and its `python_style_tool_calls`,
test-chat.cpp's LFM2 cases): LFM2 is the template with `<|tool_list_start|>` and
`<|tool_list_end|>`, LFM2.5 the one that writes `List of tools: [` without them. Keyword
arguments only; values are Python literals (strings in either quotes, their escapes
decoded; True/False/None) or JSON's (true/false/null); names may be dotted. The grammar
is llama.cpp's: a string parameter takes a quoted string, any other a Python or JSON
value (not typed further by the schema), arguments in any order. The calls are read
when `<|tool_call_end|>` comes (Python's own parser reads the list: `ast`, no code runs).

Past turns (`TurnAdapter`): LFM2.5-8B-A1B's template writes a turn's calls itself (and
its thinking, read from `thinking`, where llama.cpp copies `reasoning_content`); the
other two render content alone, so a turn's calls are written into its content in the
syntax above (values as JSON, which the syntax admits).
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    keyed_tools,
    lazy_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

log = logging.getLogger("kvserve.chat")

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_JSON_WORDS = {"true": True, "false": False, "null": None}


@dataclass(frozen=True, slots=True)
class Lfm2Format(OwnFormat):
    """Its past turns adapted (`TurnAdapter`); `<think>` is the plan's split."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        writes_calls = "tool_calls" in source
        return [_adapted(m, writes_calls) for m in messages]

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text


def detect_lfm2(source: str) -> Lfm2Format | None:
    """llama.cpp's two rules (common/chat.cpp)."""
    if "<|tool_list_start|>" in source:
        return LFM2 if "<|tool_list_end|>" in source else None
    return LFM25 if "List of tools: [" in source else None


def _adapted(message: dict[str, Any], writes_calls: bool) -> dict[str, Any]:
    if message.get("role") != "assistant":
        return message
    if isinstance(message.get("reasoning_content"), str):
        message = {**message, "thinking": message["reasoning_content"]}
    calls = message.get("tool_calls")
    if writes_calls or not calls:
        return message
    text = START + "[" + ", ".join(_call_text(c["function"]) for c in calls) + "]" + END
    content = message.get("content")
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": content + text if isinstance(content, str) else text}


def _call_text(function: dict[str, Any]) -> str:
    args = function.get("arguments")
    if not isinstance(args, dict):  # a cut-off call's text (chat/plan.py keeps it)
        return f"{function['name']}()"
    pairs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"{function['name']}({pairs})"


def _value_rules(rules: RuleSet) -> tuple[str, str]:
    """(a quoted string, any Python or JSON value): llama.cpp's python_or_json_value."""
    ws = rules.primitive("ws")
    dq = rules.add("py-dq", '"\\"" ([^"\\\\\\n] | "\\\\" [^\\n])* "\\""')
    sq = rules.add("py-sq", '"\'" ([^\'\\\\\\n] | "\\\\" [^\\n])* "\'"')
    string = rules.add("py-string", f"{dq} | {sq}")
    value = rules.reserve("py-value")
    number = rules.add("py-number", '"-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?')
    items = f'"[" {ws} ({value} ({ws} "," {ws} {value})*)? {ws} ","? {ws} "]"'
    pair = f'{value} {ws} ":" {ws} {value}'
    members = f'"{{" {ws} ({pair} ({ws} "," {ws} {pair})*)? {ws} ","? {ws} "}}"'
    words = " | ".join(literal(w) for w in ("True", "False", "None", "true", "false", "null"))
    rules.define(value, f"{string} | {number} | {words} | {items} | {members}")
    return string, value


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    string, value = _value_rules(rules)
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        props = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
        args = ""
        if isinstance(props, dict) and props:
            choices = []
            for name, schema in props.items():
                is_string = isinstance(schema, dict) and schema.get("type") == "string"
                choices.append(f"{literal(name + '=')} {string if is_string else value}")
            arg = rules.add(f"t{i}-arg", " | ".join(choices))
            args = f'({arg} ("," {ws} {arg})*)?'
        body = f"{literal(tool.name + '(')} {ws} {args} {ws} {literal(')')}"
        alternatives.append(rules.add(f"call-{i}", body))
    call = rules.add("call", " | ".join(alternatives))
    calls = f'{call} ("," {ws} {call})*' if parallel else call
    block = rules.add("block", f"{literal(START + '[')} {ws} {calls} {ws} {literal(']' + END)}")
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(block), START)
    think = thinking_block(rules, "</think>", '"<think>"')
    return thinking_then(rules, think, block, doc_key)


class Lfm2Parser(BufferedParser):
    """Content, then each call list read when it closes; a list that is not one (no
    grammar held it) stays content, as written."""

    def __init__(self, tools: Sequence[Tool] = (), reasoning: bool = True):
        """Neither matters: every call names itself, the plan splits the thinking."""
        super().__init__()
        self._in_list = False
        self._list = ""

    def _step(self, out: list[Delta]) -> bool:
        if not self._in_list:
            text, word = self._until((START,))
            out.append(Delta("content", text))
            if word is None:
                return False
            self._in_list, self._list = True, ""
            return True
        text, word = self._until((END,))
        self._list += text
        if word is None:
            return False
        self._in_list = False
        try:
            calls = python_calls(self._list)
        except ValueError as exc:
            log.debug("an LFM2 call list not read (%s): %r", exc, self._list)
            out.append(Delta("content", START + self._list + END))
            return True
        for name, args in calls:
            self._start_call(name, out)
            out.append(Delta("args", json.dumps(args, ensure_ascii=False), self.num_calls))
            self.num_calls += 1
        return True

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if not self._in_list and self._buf:
            out.append(Delta("content", self._buf))
        elif self._in_list:  # cut off: started, never complete (counted truncated)
            name = (self._list + self._buf).lstrip(" [").partition("(")[0].strip()
            if name:
                self._start_call(name, out)
        self._buf = ""
        return out


def python_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`[name(key=value, ..), ..]` as (name, arguments); ValueError if it is not that."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not Python: {exc}") from None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("not a call with keyword arguments")
        if any(kw.arg is None for kw in node.keywords):
            raise ValueError("**kwargs")
        args = {kw.arg or "": _literal(kw.value) for kw in node.keywords}
        calls.append((_dotted(node.func), args))
    return calls


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("not a function name")


def _literal(node: ast.expr) -> Any:
    """A Python literal, with JSON's true/false/null besides Python's words."""
    if isinstance(node, ast.Name) and node.id in _JSON_WORDS:
        return _JSON_WORDS[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise ValueError(f"not a literal: {exc}") from None
    if value is not None and not isinstance(value, str | int | float):  # bytes, sets, complex
        raise ValueError(f"not a JSON value: {type(value).__name__}")
    return value


def _key(node: ast.expr | None) -> str:
    value = _literal(node) if node is not None else None
    if not isinstance(value, str):
        raise ValueError("a dict key that is not a string")
    return value


LFM2 = Lfm2Format("lfm2", _grammar, Lfm2Parser, owns_reasoning=False)
LFM25 = Lfm2Format("lfm2.5", _grammar, Lfm2Parser, owns_reasoning=False)
