"""Apertus: a JSON list of calls between its own tokens, each call an object whose one
key is the tool's name and whose value is its arguments.

    <|tools_prefix|>[{"get_time": {"city": "Paris"}}, {"NAME": {..}}]<|tools_suffix|>

llama.cpp has no handler of its own for it: its autoparser derives this syntax from the
template's renders (test-chat.cpp's Apertus case). The template also has a thinking
block (`<|inner_prefix|>`), but writes it only from structured content blocks, not from
`reasoning_content`; llama.cpp's autoparser finds no thinking in its renders, and kvserve
splits none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    json_arguments,
    keyed_tools,
    lazy_at,
)
from chat.callstream import BufferedParser, Delta, JsonNesting
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

OPEN, CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"


@dataclass(frozen=True, slots=True)
class ApertusFormat(MemoizedGrammar):
    name: str = "apertus"
    native: bool = True
    owns_reasoning: bool = False

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return ApertusParser()


APERTUS = ApertusFormat()


def detect_apertus(source: str) -> ApertusFormat | None:
    return APERTUS if f"'{OPEN}'" in source and f"'{CLOSE}'" in source else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args = json_arguments(rules, i, tool)
        name = literal(json.dumps(tool.name, ensure_ascii=False))
        alternatives.append(
            rules.add(f"call-{i}", f'"{{" {ws} {name} {ws} ":" {ws} {args} {ws} "}}"')
        )
    call = rules.add("call", " | ".join(alternatives))
    calls = f'{call} ({ws} "," {ws} {call})*' if parallel else call
    block = rules.add("block", f"{literal(OPEN + '[')} {ws} {calls} {ws} {literal(']' + CLOSE)}")
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(block), OPEN)
    root = f"{block} | {document_rule(rules, doc_key)}" if doc_key else block
    return GrammarSpec(rules.text(root))


class ApertusParser(BufferedParser):
    """Splits output into content and calls, incrementally: text that may still open the
    list is held back; a call starts once its name key is read, its arguments go out as
    they arrive (the plan releases a call when it is complete)."""

    def __init__(self) -> None:
        super().__init__()
        self._state = "text"  # text | list | key | colon | args | end
        self._json = JsonNesting()

    def finish(self) -> list[Delta]:
        out = [Delta("content", self._buf)] if self._state == "text" and self._buf else []
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "text":
            text, word = self._until((OPEN,))
            out.append(Delta("content", text))
            if word is None:
                return False
            self._state = "list"
            return True
        if self._state == "args":
            return self._args(out)
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        if self._state == "key" and self._buf[0] != '"':
            self._state = "list"  # not a call object (no grammar held it): skipped
        elif self._state == "key":
            end = _string_end(self._buf)
            if end < 0:
                return False
            name, self._buf = json.loads(self._buf[:end]), self._buf[end:]
            self._start_call(str(name), out)
            self._state = "colon"
            return True
        elif self._state == "colon":
            self._buf, self._state, self._json = self._buf.lstrip(":"), "args", JsonNesting()
        elif self._may_become(CLOSE):
            return False
        elif self._take(CLOSE):
            self._state = "text"
        elif self._buf[0] == "{" and self._state == "list":
            self._buf, self._state = self._buf[1:], "key"
        elif self._buf[0] == "}" and self._state == "end":
            self._buf, self._state = self._buf[1:], "list"
            self.num_calls += 1
        else:
            self._buf = self._buf[1:]  # `[`, `,`, `]` and stray text between calls
        return True

    def _args(self, out: list[Delta]) -> bool:
        """The arguments' JSON text, up to where its outermost value closes."""
        if self._json.depth == 0:
            self._buf = self._buf.lstrip()
        for i, ch in enumerate(self._buf):
            self._json.step(ch)
            if self._json.depth == 0 and not self._json.in_string and ch in "}]":
                out.append(Delta("args", self._buf[: i + 1], self.num_calls))
                self._buf, self._state = self._buf[i + 1 :], "end"
                return True
        out.append(Delta("args", self._buf, self.num_calls))
        self._buf = ""
        return False


def _string_end(text: str) -> int:
    """The end of the JSON string that opens `text` (-1: not closed yet)."""
    escape = False
    for i, ch in enumerate(text[1:], 1):
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
        elif ch == '"':
            return i + 1
    return -1
