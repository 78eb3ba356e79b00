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

from chat.callformat import (
    CallParser,
    GrammarSpec,
    OwnFormat,
    document_rule,
    json_arguments,
    keyed_tools,
    lazy_at,
)
from chat.callstream import BlockParser, Delta, JsonNesting
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

OPEN, CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"


def detect_apertus(source: str) -> OwnFormat | None:
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


class ApertusParser(BlockParser):
    """Splits output into content and calls, incrementally: text that may still open the
    list is held back; a call starts once its name key is read, its arguments go out as
    they arrive (the plan releases a call when it is complete)."""

    OPEN = OPEN

    def __init__(self) -> None:
        super().__init__()  # states: text | block (in the list) | key | colon | args | end
        self._json = JsonNesting()

    def _block_step(self, out: list[Delta]) -> bool:
        if self._state == "args":
            return self._args(out)
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        if self._state == "key" and self._buf[0] != '"':
            self._state = "block"  # not a call object (no grammar held it): skipped
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
        elif self._buf[0] == "{" and self._state == "block":
            self._buf, self._state = self._buf[1:], "key"
        elif self._buf[0] == "}" and self._state == "end":
            self._buf, self._state = self._buf[1:], "block"
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


def _new_parser(tools: Sequence[Tool], reasoning: bool) -> CallParser:
    """Neither matters: every call names itself, and there is no thinking to split."""
    return ApertusParser()


APERTUS = OwnFormat("apertus", _grammar, _new_parser, owns_reasoning=False)


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
