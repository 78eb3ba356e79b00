"""MiniMax-M2: calls as `<invoke>` elements with `<parameter name=..>` tags in one
`<minimax:tool_call>` block; thinking in `<think>`, which the generation prompt opens.

    <minimax:tool_call>
    <invoke name="get_time">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

llama.cpp has no handler of its own for it: its autoparser derives this syntax from the
template's renders (test-chat.cpp's MiniMax-M2 cases). Values are written as the
template writes them (`v | tojson if v is not string`) and typed back as Qwen3-Coder's
(chat/tagged_args.py). The `<think>` split is the plan's (chat/reasoning.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    starts_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BlockParser, Delta
from chat.gbnf import RuleSet, literal
from chat.invoke_elements import InvokeElements
from chat.tagged_args import Tags, TypedArgs, tagged_calls
from chat.tools import Tool

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = '<invoke name="', "</invoke>"
PARAM, PARAM_END = '<parameter name="', "</parameter>"


def detect_minimax2(source: str) -> OwnFormat | None:
    return MINIMAX_M2 if OPEN in source and INVOKE in source else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")

    def param(name: str, value: str) -> str:
        head = literal(f'{PARAM}{name}">')
        return f"{head} {value} {literal(PARAM_END)} {ws}"

    tags = Tags(param, PARAM_END, "m2-text")

    def parts(name: str, args: str) -> tuple[str, ...]:
        return literal(INVOKE + name + '">'), ws, args, literal(INVOKE_END)

    call = tagged_calls(rules, key, tags, parts)
    calls = f"{call} ({ws} {call})*" if parallel else call
    block = rules.add("block", f"{literal(OPEN)} {ws} {calls} {ws} {literal(CLOSE)}")
    if mode == "auto" and not doc_key:
        return GrammarSpec(rules.text(block), lazy=True, trigger_patterns=(starts_at(OPEN),))
    # The prompt opens `<think>`: its rest and `</think>` may come before a forced block.
    think = thinking_block(rules, "</think>", '"<think>"?', "[ \\n]*")
    return thinking_then(rules, think, block, doc_key)


class Minimax2Parser(InvokeElements, BlockParser):
    """Splits (reasoning-free) output into content and calls, incrementally; text that
    may still open the block is held back, each value is typed once it closes."""

    OPEN = OPEN
    INVOKE, INVOKE_END, PARAM, PARAM_END = INVOKE, INVOKE_END, PARAM, PARAM_END
    _closing = CLOSE

    def __init__(self, tools: Sequence[Tool], reasoning: bool = True):
        """`reasoning`: the plan's `<think>` split has it (the format owns none)."""
        super().__init__()  # states: text | block | args | value
        self._args = TypedArgs(tools)
        self._key = ""
        self._value = ""

    def _block_step(self, out: list[Delta]) -> bool:
        return self._element_step(out)

    def _open_call(self, name: str) -> str:
        return self._args.open(name)

    def _open_param(self, head: str) -> None:
        self._key = head

    def _close_param(self, value: str, out: list[Delta]) -> None:
        out.append(Delta("args", self._args.add(self._key, value), self.num_calls))


# `<think>` is the plan's split (chat/reasoning.py): the format owns no thinking
MINIMAX_M2 = OwnFormat("minimax-m2", _grammar, Minimax2Parser, owns_reasoning=False)
