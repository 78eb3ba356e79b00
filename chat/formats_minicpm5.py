"""MiniCPM5's XML calls, one element a call, in a row after any content:

    <function name="python"><param name="code">print(1)</param></function>
    <function name="html"><param name="markup"><![CDATA[<a>hi</a>]]></param></function>

As llama.cpp reads them (common/parsers/minicpm5.cpp, test-chat.cpp's MiniCPM5 cases):
the template that names "Tool usage guidelines:", `<function name="` and `<param
name="`. A parameter whose schema admits a string is that string, its raw text up to
`</param>` or the text of a CDATA block (which may hold `</param>`: the template wraps a
string holding `<`, `&` or a newline in one); any other is JSON matching its schema.
Thinking is `<think>…</think>`, opened by the generation prompt when `enable_thinking`
is on: the plan's `<think>` split reads it (chat/reasoning.py), so a forced call may
follow the thinking. Arguments: required ones first in any order, then optional ones
(chat/tagged_args.py; llama.cpp's grammar takes them in any order).
"""

from __future__ import annotations

from collections.abc import Sequence

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    excluding,
    lazy_or_forced,
)
from chat.callstream import BlockParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tagged_args import Tags, TypedArgs, tagged_calls
from chat.tools import Tool

FUNCTION, FUNCTION_END = '<function name="', "</function>"
PARAM, PARAM_END = '<param name="', "</param>"
CDATA, CDATA_END = "<![CDATA[", "]]>"
TRIGGER = "<function"  # llama.cpp's trigger word
_TEXT_RULE = "cpm-text"  # the rule of a raw-text value (tagged_arguments names it)
# What the template names (llama.cpp's rule, common/chat.cpp).
DETECT = ("Tool usage guidelines:", FUNCTION, PARAM)


def detect_minicpm5(source: str) -> OwnFormat | None:
    return MINICPM5 if all(word in source for word in DETECT) else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")

    def param(name: str, value: str) -> str:
        if value == f"{_TEXT_RULE}-0":  # a string: raw text, or a CDATA block
            if "cdata-0" not in rules.rules:
                excluding(rules, "cdata", CDATA_END)
            value = f"({literal(CDATA)} cdata-0 {literal(CDATA_END)} | {value})"
        head = literal(PARAM + name + '">')
        return f"{head} {value} {literal(PARAM_END)} {ws}"

    tags = Tags(param, PARAM_END, _TEXT_RULE)

    def parts(name: str, args: str) -> tuple[str, ...]:
        return literal(FUNCTION + name + '">'), args, literal(FUNCTION_END)

    call = tagged_calls(rules, key, tags, parts)
    calls = f"{call} ({ws} {call})*" if parallel else call
    return lazy_or_forced(rules, calls, mode, doc_key, TRIGGER, "</think>", '"<think>"?',
                          think_tail="[ \\n]*")  # fmt: skip


class MiniCpm5Parser(BlockParser):
    """Splits (reasoning-free) output into content and calls, incrementally; text that
    may still open a call is held back, each value is typed once it closes."""

    def __init__(self, tools: Sequence[Tool], reasoning: bool = True):
        """`reasoning`: the plan's `<think>` split has it (the format owns none)."""
        super().__init__()  # states: text | call | value | raw | cdata
        self._calls = bool(tools)
        self._args = TypedArgs(tools, text_if_string=True)
        self._key = ""
        self._value = ""  # the value's text so far

    def _text(self, out: list[Delta]) -> bool:
        if not self._calls:
            out.append(Delta("content", self._buf))
            self._buf = ""
            return False
        text, word = self._until((FUNCTION,))
        out.append(Delta("content", text))
        if word is None:
            return False
        end = self._buf.find('">')
        if end < 0:
            self._buf = word + self._buf  # the name not complete yet: read it again
            return False
        name, self._buf = self._buf[:end], self._buf[end + 2 :]
        self._start_call(name, out)
        out.append(Delta("args", self._args.open(name), self.num_calls))
        self._state = "call"
        return True

    def _block_step(self, out: list[Delta]) -> bool:
        if self._state == "value":  # a CDATA block, or raw text
            if self._may_become(CDATA):
                return False
            self._state = "cdata" if self._take(CDATA) else "raw"
            return True
        if self._state in ("raw", "cdata"):
            text, word = self._until(
                (CDATA_END + PARAM_END if self._state == "cdata" else PARAM_END,)
            )
            self._value += text
            if word is None:
                return False
            out.append(Delta("args", self._args.add(self._key, self._value), self.num_calls))
            self._state = "call"
            return True
        return self._in_call(out)

    def _in_call(self, out: list[Delta]) -> bool:
        """Between arguments: the next one, or the call's end."""
        self._buf = self._buf.lstrip()
        if self._may_become(PARAM) or self._may_become(FUNCTION_END):
            return False
        if self._take(FUNCTION_END):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._state = "text"
        elif self._buf.startswith(PARAM):
            end = self._buf.find('">', len(PARAM))
            if end < 0:
                return False
            self._key, self._buf = self._buf[len(PARAM) : end], self._buf[end + 2 :]
            self._value, self._state = "", "value"
        elif self._buf:
            self._buf = self._buf[1:]  # stray text inside a call (no grammar held it)
        return True


# `<think>` is the plan's split (chat/reasoning.py): the format owns no thinking
MINICPM5 = OwnFormat("minicpm5", _grammar, MiniCpm5Parser, owns_reasoning=False)
