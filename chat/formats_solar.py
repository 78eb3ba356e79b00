"""Upstage Solar Open: an answer is a series of assistant messages, each opened by
`<|begin|>assistant` and a kind marker: `<|think|>` (reasoning), `<|content|>` (the
answer) or `<|tool_calls|>` (calls, each with an id the model writes).

    <|think|>plan<|end|><|begin|>assistant<|content|>text<|end|>
    <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{..}<|tool_call:end|><|calls|>

The generation prompt writes the first `<|begin|>assistant` (and, for the template's
`reasoning_effort` low or minimal, an empty thinking message before it). llama.cpp has no
handler of its own for it: its autoparser derives this syntax from the template's renders
(test-chat.cpp only checks that the template takes a reasoning effort). The parser splits
the thinking itself (owns_reasoning) and drops the message markers; with
`reasoning_format: "none"` the thinking's text stays in the content. A call's
id is kvserve's own `call_…` (the grammar lets the model write any short id, which the
turn sent back replays as sampled).
"""

from __future__ import annotations

from collections.abc import Sequence

from chat.callformat import GrammarSpec, OwnFormat, json_arguments, keyed_tools, lazy_or_forced
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

HEADER, THINK, CONTENT, END = "<|begin|>assistant", "<|think|>", "<|content|>", "<|end|>"
CALLS, CALLS_END = "<|tool_calls|>", "<|calls|>"
CALL, NAME, ARGS, CALL_END = (
    "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"
)  # fmt: skip


def detect_solar(source: str) -> OwnFormat | None:
    return SOLAR_OPEN if all(w in source for w in (CALLS, CALL, NAME, ARGS, CALLS_END)) else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    call_id = rules.add("call-id", "[A-Za-z0-9_-]{1,40}")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args = json_arguments(rules, i, tool)
        head = f"{literal(CALL)} {call_id} {literal(NAME + tool.name + ARGS)}"
        alternatives.append(rules.add(f"call-{i}", f"{head} {args} {literal(CALL_END)}"))
    call = rules.add("call", " | ".join(alternatives))
    block = rules.add(
        "block", f"{literal(CALLS)} {call}{'+' if parallel else ''} {literal(CALLS_END)}"
    )

    def in_content(document: str) -> str:  # a response schema's document: the answer message
        return f"{literal(CONTENT)} {document} {literal(END)}"

    return lazy_or_forced(rules, block, mode, doc_key, CALLS, END, literal(THINK),
                          think_tail=literal(HEADER), answer_doc=in_content)  # fmt: skip


class SolarParser(BufferedParser):
    """Messages -> reasoning / content / calls, incrementally. Text that may still be a
    marker is held back until it resolves."""

    MARKS = (HEADER, THINK, CONTENT, END, CALLS)

    def __init__(self, tools: Sequence[Tool], reasoning: bool):
        super().__init__()
        self._calls, self._reasoning = bool(tools), reasoning
        self._state = "text"  # text | think | calls | id | name | args
        self._name = ""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("text", "think") and self._buf:
            out.append(Delta("reasoning" if self._state == "think" else "content", self._buf))
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        state = self._state
        if state == "text":
            return self._text(out)
        if state in ("think", "id", "name", "args"):
            end = {"think": END, "id": NAME, "name": ARGS, "args": CALL_END}[state]
            text, word = self._until((end,))
            if state == "think":
                out.append(Delta("reasoning", text))
            elif state == "args":
                out.append(Delta("args", text, self.num_calls))
            elif state == "name":
                self._name += text
            if word is None:
                return False
            self._state = {"think": "text", "id": "name", "name": "args", "args": "calls"}[state]
            if state == "id":
                self._name = ""
            elif state == "name":
                self._start_call(self._name.strip(), out)
            elif state == "args":
                self.num_calls += 1
            return True
        # calls: between the calls of one message
        self._buf = self._buf.lstrip()
        if not self._buf or self._may_become(CALL) or self._may_become(CALLS_END):
            return False
        if self._take(CALL):
            self._state = "id"
        elif self._take(CALLS_END):
            self._state = "text"
        else:
            self._buf = self._buf[1:]  # stray text inside the calls (no grammar held it)
        return True

    def _text(self, out: list[Delta]) -> bool:
        text, word = self._until(self.MARKS)
        out.append(Delta("content", text))
        if word is None:
            return False
        if word == THINK and self._reasoning:
            self._state = "think"
        elif word == CALLS and self._calls:
            self._state = "calls"
        elif (word == THINK and not self._reasoning) or word == CALLS:
            out.append(Delta("content", word))  # as written: not split, or no tools offered
        return True  # a message's header, `<|content|>` and `<|end|>` are markers: dropped


SOLAR_OPEN = OwnFormat("solar-open", _grammar, SolarParser)
