"""Command R7B's and Cohere2 MoE's marked blocks: thinking, then an answer or a list of
calls.

    <|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>answer<|END_RESPONSE|>
    <|START_THINKING|>plan<|END_THINKING|><|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "NAME", "parameters": {..}}
    ]<|END_ACTION|>

As llama.cpp reads it (test-chat.cpp's Command R7B cases): the thinking block ->
`reasoning_content`, the response block's text -> `content`, each action -> a call. The
parser splits the thinking itself (owns_reasoning): the blocks are this format's own
markers, not `<think>`. An action list is parsed when it closes (a call is released
only once complete anyway). The template opens no block in the prompt unless thinking
is off (`<|START_THINKING|><|END_THINKING|>`).

Cohere2 MoE (common/parsers/cohere2moe.cpp, test-chat.cpp's Cohere2MoE cases) writes its
answer in `<|START_TEXT|>`..`<|END_TEXT|>` and its generation prompt opens the thinking
block, so its output starts inside it: the text before the first `<|END_THINKING|>`,
`<|START_TEXT|>` or `<|START_ACTION|>` is reasoning (llama.cpp's `until_one_of`). With
`reasoning_format: "none"` that text stays in the content as sampled (llama.cpp's
content also holds the `<|START_THINKING|>` of its prompt, which it parses with the
output).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    json_arguments,
    keyed_tools,
    lazy_or_forced,
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

THINK = ("<|START_THINKING|>", "<|END_THINKING|>")
RESPONSE = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
TEXT = ("<|START_TEXT|>", "<|END_TEXT|>")  # Cohere2 MoE's answer block
ACTION = ("<|START_ACTION|>", "<|END_ACTION|>")


def detect_cohere(source: str) -> OwnFormat | None:
    """The action and answer markers (llama.cpp's rules, common/chat.cpp: Cohere2 MoE's
    `<|START_TEXT|>`, Command R7B's `<|START_RESPONSE|>`)."""
    if ACTION[0] in source and TEXT[0] in source:
        return COHERE2_MOE
    if ACTION[0] in source and RESPONSE[0] in source:
        return COMMAND_R7B
    return None


def _grammar(
    key: str, mode: str, parallel: bool, doc_key: str, answer: tuple[str, str] = RESPONSE
) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    # the template writes the list with newlines and indents between the calls
    sp = rules.add("sp", "[ \\n]{0,16}")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args, name = json_arguments(rules, i, tool), tool.name
        alternatives.append(rules.add(f"call-{i}", (
            f'"{{" {ws} "\\"tool_call_id\\"" {ws} ":" {ws} "\\"" [0-9]{{1,4}} "\\"" {ws} "," {ws} '
            f'"\\"tool_name\\"" {ws} ":" {ws} {literal(json.dumps(name))} {ws} "," {ws} '
            f'"\\"parameters\\"" {ws} ":" {ws} {args} {ws} "}}"'
        )))  # fmt: skip
    call = rules.add("call", " | ".join(alternatives))
    calls = f'{call} ({sp} "," {sp} {call})*' if parallel else call
    action = rules.add(
        "action", f"{literal(ACTION[0] + '[')} {sp} {calls} {sp} {literal(']' + ACTION[1])}"
    )

    # Auto mode with a response schema: the document is the answer, in its block.
    def in_block(document: str) -> str:
        return f"{literal(answer[0])} {document} {literal(answer[1])}"

    return lazy_or_forced(rules, action, mode, doc_key, ACTION[0], THINK[1],
                          f"{literal(THINK[0])}?", answer_doc=in_block)  # fmt: skip


class CohereParser(BufferedParser):
    """Blocks -> reasoning / content / calls, incrementally. Text that may still be a
    marker is held back until it resolves."""

    def __init__(
        self, tools: Sequence[Tool], reasoning: bool, answer: tuple[str, str] = RESPONSE,
        opened: bool = False,
    ):  # fmt: skip
        """`answer`: the answer block's markers; `opened`: the prompt opened the thinking
        (Cohere2 MoE), so the output starts inside it."""
        super().__init__()
        self._blocks = {answer[0]: ("content", answer[1])}
        if reasoning:
            self._blocks[THINK[0]] = ("reasoning", THINK[1])
        if tools:
            self._blocks[ACTION[0]] = ("action", ACTION[1])
        # (kind, end marker) inside a block; "lead": the thinking the prompt opened, which
        # ends at its close or at the start of an answer or an action
        lead = opened and reasoning
        self._block: tuple[str, str] | None = ("lead", THINK[1]) if lead else None
        self._action = ""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        kind = self._block[0] if self._block else "content"
        if kind != "action" and self._buf:  # an action cut off is no call
            kind = "reasoning" if kind == "lead" else kind
            out.append(Delta(kind, self._buf))  # type: ignore[arg-type]
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._block is not None and self._block[0] == "lead":
            ends = (THINK[1], *(w for w in self._blocks if w != THINK[0]))
            text, word = self._until(ends)
            out.append(Delta("reasoning", text))
            if word is None:
                return False
            self._block = None if word == THINK[1] else self._blocks[word]
            return True
        if self._block is None:
            text, start = self._until(tuple(self._blocks))
            out.append(Delta("content", text))
            if start is None:
                return False
            self._block = self._blocks[start]
            return True
        kind, end = self._block
        text, closed = self._until((end,))
        self._emit_text(kind, text, out)
        if closed is None:
            return False
        if kind == "action":
            self._calls(self._action, out)
            self._action = ""
        self._block = None
        return True

    def _emit_text(self, kind: str, text: str, out: list[Delta]) -> None:
        if kind == "action":
            self._action += text
        elif text:
            out.append(Delta(kind, text))  # type: ignore[arg-type]

    def _calls(self, text: str, out: list[Delta]) -> None:
        for name, args in action_calls(text):
            self._whole_call(name, args, out)


def action_calls(text: str) -> list[tuple[str, Any]]:
    """The calls of a Cohere action list (Command R7B's, Command R+'s): each item's
    `tool_name` and `parameters`. Not a list of calls (no grammar held it): none."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    return [(item["tool_name"], item.get("parameters") or {})
            for item in (items if isinstance(items, list) else [])
            if isinstance(item, dict) and isinstance(item.get("tool_name"), str)]  # fmt: skip


COMMAND_R7B = OwnFormat("command-r7b", _grammar, CohereParser)
COHERE2_MOE = OwnFormat(
    "cohere2-moe", partial(_grammar, answer=TEXT), partial(CohereParser, answer=TEXT, opened=True)
)
