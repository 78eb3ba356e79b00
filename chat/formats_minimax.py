"""MiniMax-M3: calls as `<invoke>` elements in one namespaced `<tool_call>` block,
thinking between `<mm:think>` and `</mm:think>`.

    <mm:think>plan</mm:think>Sure.]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_time">]<]minimax[>[<city>Paris]<]minimax[>[</city>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

(the call's elements written on one line, without the breaks drawn here)

As llama.cpp reads it (common/parsers/minimax-m3.cpp, test-chat.cpp's MiniMax-M3 cases):
the template that names the namespace token `]<]minimax[>[`, `<tool_call>` and
`<invoke name=`. The generation prompt opens no thinking: the model writes a thinking
block, or a bare `</mm:think>` (a turn without thinking), then content, then the block.
Arguments are elements typed by the tool's schema (chat/minimax_values.py). The parser
splits the thinking itself (owns_reasoning) and reads a call when its `</invoke>`
comes; a string value holding that tag would end the call there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    input_grammar,
    keyed_tools,
    lazy_or_forced,
)
from chat.callstream import Delta, ThinkingParser
from chat.gbnf import RuleSet, literal
from chat.minimax_values import NS, MinimaxSyntaxError, MinimaxValues, close_tag, minimax_json
from chat.tools import INPUT, Tool

log = logging.getLogger("kvserve.chat")

THINK_OPEN, THINK_CLOSE = "<mm:think>", "</mm:think>"
BLOCK_OPEN, BLOCK_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE, INVOKE_END = NS + '<invoke name="', NS + "</invoke>"
_INPUT_SCHEMA = {"type": "object", "properties": {INPUT: {"type": "string"}}}
# The call a replayed text turn followed by results is written with (never a tool's name).
_AS_CALL = "\x00kvserve-text\x00"
_AS_CALL_BLOCK = f'{BLOCK_OPEN}\n{INVOKE}{_AS_CALL}">{INVOKE_END}\n{BLOCK_CLOSE}'


@dataclass(frozen=True, slots=True)
class MinimaxFormat(OwnFormat):
    """Its past turns adapted (`TurnAdapter`)."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A turn with text and no calls followed by results is a replayed turn
        (chat/replay.py: its text is a mark the sampled calls replace); the template
        refuses results after a turn without calls, so it gets a call named `_AS_CALL`,
        whose block `adapt_prompt` takes out again."""
        out = []
        for i, message in enumerate(messages):
            following = i + 1 < len(messages) and messages[i + 1].get("role") == "tool"
            if message.get("role") == "assistant" and not message.get("tool_calls") and following:
                call = {"type": "function", "function": {"name": _AS_CALL, "arguments": {}}}
                message = {**message, "tool_calls": [call]}
            out.append(message)
        return out

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text.replace(_AS_CALL_BLOCK, "")


def detect_minimax(source: str) -> MinimaxFormat | None:
    """llama.cpp's rule (common/chat.cpp)."""
    named = all(word in source for word in (NS, "<tool_call>", "<invoke name="))
    return MINIMAX_M3 if named else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        values = MinimaxValues(rules, tool.parameters, f"t{i}-")
        if tool.grammar is not None:  # a custom tool: its input as one raw-text element
            body = (f"{literal(f'{NS}<{INPUT}>')} {input_grammar(rules, i, tool.grammar, False)}"
                    f" {literal(close_tag(INPUT))}")  # fmt: skip
        elif isinstance(tool.parameters, dict) and tool.parameters.get("properties"):
            body = values.members(tool.parameters, f"t{i}-arg")
        else:
            body = '""'
        head, end = literal(f'{INVOKE}{tool.name}">'), literal(INVOKE_END)
        alternatives.append(rules.add(f"call-{i}", f"{head} {ws} {body} {ws} {end}"))
    call = rules.add("call", " | ".join(alternatives))
    calls = f"{call} ({ws} {call})*" if parallel else call
    block = rules.add("block", f"{literal(BLOCK_OPEN)} {ws} {calls} {ws} {literal(BLOCK_CLOSE)}")
    # A forced block may follow a thinking block or the bare `</mm:think>` of a turn
    # without thinking (llama.cpp's grammar: either, or neither).
    return lazy_or_forced(rules, block, mode, doc_key, BLOCK_OPEN, THINK_CLOSE,
                          literal(THINK_OPEN), bare_close=True)  # fmt: skip


class MinimaxParser(ThinkingParser):
    """Thinking, content and the calls block, incrementally; text that may still be a
    marker is held back until it resolves."""

    # a thinking block, the bare close of none, or neither
    LEAD = ((THINK_OPEN, "think"), (THINK_CLOSE, "text"))
    THINK_CLOSE = THINK_CLOSE
    OPENERS = {BLOCK_OPEN: "block"}

    def __init__(self, tools: Sequence[Tool], reasoning: bool):
        super().__init__(tools, reasoning)
        # a custom tool's one element is its input, a string whatever it looks like
        self._schemas = {t.name: _INPUT_SCHEMA if t.grammar else t.parameters for t in tools}
        self._name = ""
        self._body = ""  # the open call's elements so far

    def _call_step(self, out: list[Delta]) -> bool:
        if self._state == "block":
            return self._block(out)
        # invoke: the call's elements, up to its </invoke>
        text, word = self._until((INVOKE_END,))
        self._body += text
        if word is None:
            return False
        self._end_call(out)
        self._state = "block"
        return True

    def _block(self, out: list[Delta]) -> bool:
        """Inside the block: calls, blanks between them, its close."""
        self._buf = self._buf.lstrip()
        if self._may_become(INVOKE) or self._may_become(BLOCK_CLOSE):
            return False
        if self._take(BLOCK_CLOSE):
            self._state = "text"
        elif self._buf.startswith(INVOKE):
            end = self._buf.find('">', len(INVOKE))
            if end < 0:
                return False
            self._name = self._buf[len(INVOKE) : end]
            self._buf, self._body, self._state = self._buf[end + 2 :], "", "invoke"
        elif self._buf:
            self._buf = self._buf[1:]  # stray text inside the block (no grammar held it)
        return True

    def _end_call(self, out: list[Delta]) -> None:
        try:
            args = minimax_json(self._body, self._schemas.get(self._name))
        except MinimaxSyntaxError as exc:
            log.debug("a MiniMax-M3 call not read (%s): %r", exc, self._body)
            return  # not a call (no grammar held it): nothing to report
        self._whole_call(self._name, args, out)

    def _finish_call(self, out: list[Delta]) -> None:
        if self._state == "invoke":  # cut off: started, never complete (truncated)
            self._start_call(self._name, out)


MINIMAX_M3 = MinimaxFormat("minimax-m3", _grammar, MinimaxParser)
