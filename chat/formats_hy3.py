"""Tencent Hy3: GLM's key/value tags in its own `:opensource` tokens, calls in one block;
thinking in `<think:opensource>`, which the generation prompt opens when the template's
`reasoning_effort` is `low` or `high` (and closes empty for its default, `no_think`).

    <tool_calls:opensource>
    <tool_call:opensource>NAME<tool_sep:opensource>
    <arg_key:opensource>KEY</arg_key:opensource>
    <arg_value:opensource>VALUE</arg_value:opensource>
    </tool_call:opensource>
    </tool_calls:opensource>

llama.cpp has no handler of its own for it: its autoparser derives this syntax from the
template's renders. Values are written as the template writes them (`v | tojson if v is
not string`) and typed back as Qwen3-Coder's (chat/tagged_args.py). The thinking split is
the plan's, with the template's tags (chat/reasoning.py `thinking_syntax`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    lazy_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BlockParser, Delta
from chat.gbnf import RuleSet, literal
from chat.reasoning import HY3_THINKING
from chat.tagged_args import Tags, TypedArgs, tagged_calls
from chat.tools import Tool

OPEN, CLOSE = "<tool_calls:opensource>", "</tool_calls:opensource>"
CALL, SEP, CALL_END = "<tool_call:opensource>", "<tool_sep:opensource>", "</tool_call:opensource>"
KEY, KEY_END = "<arg_key:opensource>", "</arg_key:opensource>"
VALUE, VALUE_END = "<arg_value:opensource>", "</arg_value:opensource>"


@dataclass(frozen=True, slots=True)
class Hy3Format(MemoizedGrammar):
    name: str = "hy3"
    native: bool = True
    owns_reasoning: bool = False
    opened: bool = False  # set by for_prompt: the prompt opened the thinking

    def for_prompt(self, prompt: str) -> Hy3Format:
        """Where the prompt opened the thinking, a forced call must close it first: a
        call written inside it would be read as reasoning."""
        return replace(self, opened=HY3_THINKING.starts_inside(prompt))

    def bound_to(self) -> str:
        return str(self.opened)

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self.opened, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return Hy3Parser(tools)


HY3 = Hy3Format()


def detect_hy3(source: str) -> Hy3Format | None:
    """The template builds its tokens from a suffix ('<tool_calls{}>'.format(HYTK))."""
    return HY3 if "'<tool_calls{}>'" in source and "'<arg_key{}>'" in source else None


def _grammar(opened: bool, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()

    def param(name: str, value: str) -> str:
        head = literal(f"{KEY}{name}{KEY_END}\n{VALUE}")
        return f"{head} {value} {literal(VALUE_END + chr(10))}"

    tags = Tags(param, VALUE_END, "hy3-text")

    def parts(name: str, args: str) -> tuple[str, ...]:
        return literal(f"{CALL}{name}{SEP}\n"), args, literal(CALL_END + "\n")

    call = tagged_calls(rules, key, tags, parts)
    calls = f"{call}+" if parallel else call
    block = rules.add("block", f"{literal(OPEN + chr(10))} {calls} {literal(CLOSE)}")
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(block), OPEN)
    opening = "" if opened else literal(HY3_THINKING.open)
    think = thinking_block(rules, HY3_THINKING.close, opening)
    if not opened:
        return thinking_then(rules, think, block, doc_key)
    answer = f"({block} | {document_rule(rules, doc_key)})" if doc_key else block
    return GrammarSpec(rules.text(f"{think} {answer}"))


class Hy3Parser(BlockParser):
    """Splits (reasoning-free) output into content and calls, incrementally; text that
    may still open the block is held back, each value is typed once it closes."""

    OPEN = OPEN

    def __init__(self, tools: Sequence[Tool]):
        super().__init__()  # states: text | block | name | args | key | value
        self._args = TypedArgs(tools)
        self._key = ""

    def _block_step(self, out: list[Delta]) -> bool:
        state = self._state
        if state in ("name", "key", "value"):
            end = {"name": SEP, "key": KEY_END, "value": VALUE_END}[state]
            at = self._buf.find(end)
            if at < 0:
                return False
            text, self._buf = self._buf[:at], self._buf[at + len(end) :]
            if state == "name":
                self._start_call(text.strip(), out)
                out.append(Delta("args", self._args.open(text.strip()), self.num_calls))
                self._state = "args"
            elif state == "key":
                self._key, self._state = text.strip(), "args"
            else:
                out.append(Delta("args", self._args.add(self._key, text), self.num_calls))
                self._state = "args"
            return True
        self._buf = self._buf.lstrip()
        words = (CALL, CLOSE) if state == "block" else (KEY, VALUE, CALL_END)
        if any(self._may_become(w) for w in words) or not self._buf:
            return False
        if state == "block" and self._take(CALL):
            self._state = "name"
        elif state == "block" and self._take(CLOSE):
            self._state = "text"
        elif self._take(KEY):
            self._state = "key"
        elif self._take(VALUE):
            self._state = "value"
        elif self._take(CALL_END):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._state = "block"
        else:
            self._buf = self._buf[1:]  # stray text inside the block (no grammar held it)
        return True
