"""Ministral 3 / Magistral / Devstral: one `[TOOL_CALLS]` per call, its arguments after
`[ARGS]`, thinking between `[THINK]` and `[/THINK]` at the start of the answer; and
Mistral Small 3.2, which writes `[CALL_ID]` and a 9-character id before `[ARGS]`.

    [THINK]plan[/THINK]Sure.[TOOL_CALLS]get_time[ARGS]{"city": "Paris"}[TOOL_CALLS]..

As llama.cpp reads it (common/parsers/ministral3.cpp, test-chat.cpp's Ministral 3 and
Devstral cases): the template that names `[SYSTEM_PROMPT]`, `[TOOL_CALLS]` and `[ARGS]`
but no `[CALL_ID]` (Mistral Small 3.2 writes an id between the name and `[ARGS]`). A
thinking block only at the start is reasoning (a `[TOOL_CALLS]` inside it stays
reasoning); then content up to the first `[TOOL_CALLS]`, then calls, one after another.
Mistral Small 3.2 (test-chat.cpp's case, its autoparser): the id the model samples is the
call's id (its template refuses a call sent back without a 9-character one).
The parser splits the thinking itself (owns_reasoning); with `reasoning_format: "none"`
the block stays in the content, as llama.cpp leaves it.

Past turns (`TurnAdapter`, as llama.cpp's handler does): an assistant turn's
`reasoning_content` is written as the template's `thinking` block before its text, so a
turn renders as it was sampled, thinking included. Only for the template that renders
thinking blocks (Ministral 3's): Devstral's reads a turn's first block as its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    json_arguments,
    keyed_tools,
    lazy_or_forced,
)
from chat.callstream import Delta, JsonNesting, ThinkingParser
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

THINK_OPEN, THINK_CLOSE = "[THINK]", "[/THINK]"
CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


@dataclass(frozen=True, slots=True)
class MinistralFormat(OwnFormat):
    """Its past turns' thinking written back (`TurnAdapter`)."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if THINK_OPEN not in source:  # Devstral: no thinking blocks in its template
            return messages
        return [_with_thinking(m) for m in messages]

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text


def detect_ministral(source: str) -> MinistralFormat | None:
    """llama.cpp's rule for Ministral 3 (common/chat.cpp, checked before every other
    family); Mistral Small 3.2 names `[CALL_ID]` too (llama.cpp's autoparser reads it)."""
    if not all(word in source for word in (CALLS, ARGS)):
        return None
    if CALL_ID in source:
        return MISTRAL_SMALL
    return MINISTRAL3 if "[SYSTEM_PROMPT]" in source else None


def _with_thinking(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's `reasoning_content` as a thinking block before its text."""
    reasoning = message.get("reasoning_content")
    if message.get("role") != "assistant" or not isinstance(reasoning, str):
        return message
    blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": reasoning}]
    content = message.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    rest = {k: v for k, v in message.items() if k != "reasoning_content"}
    return {**rest, "content": blocks}


def _grammar(key: str, mode: str, parallel: bool, doc_key: str, call_id: bool) -> GrammarSpec:
    rules = RuleSet()
    alternatives = []
    # the id the template demands of a call sent back (9 alphanumerics), sampled
    ident = f"{literal(CALL_ID)} [a-zA-Z0-9]{{9}} " if call_id else ""
    for i, tool in enumerate(keyed_tools(key)):
        args = json_arguments(rules, i, tool)
        head = f"{literal(tool.name)} {ident}{literal(ARGS)}"
        alternatives.append(rules.add(f"call-{i}", f"{head} {args}"))
    call = rules.add("call", f"{literal(CALLS)} ({' | '.join(alternatives)})")
    calls = f"{call}+" if parallel else call
    # Forced (or calls | a document): the thinking may come first, as llama.cpp's
    # grammar allows, so that a forced call does not land inside the reasoning.
    return lazy_or_forced(rules, calls, mode, doc_key, CALLS, THINK_CLOSE, literal(THINK_OPEN))


class MinistralParser(ThinkingParser):
    """Thinking, content and calls, incrementally; text that may still be a marker is
    held back until it resolves. A call's arguments stream as they arrive; it is
    complete when its JSON object closes."""

    LEAD = ((THINK_OPEN, "think"),)  # a thinking block opens the answer, or there is none
    LEAD_BLANKS = True
    THINK_CLOSE = THINK_CLOSE
    OPENERS = {CALLS: "name"}
    CONTENT_STATES = ("between",)

    def __init__(self, tools: Sequence[Tool], reasoning: bool):
        super().__init__(tools, reasoning)
        self._name = ""
        self._id = ""  # Mistral Small 3.2's sampled call id: the call's own
        self._json = JsonNesting()

    def _call_step(self, out: list[Delta]) -> bool:
        state = self._state
        if state in ("name", "id"):
            text, word = self._until((ARGS, CALL_ID))
            if state == "name":
                self._name += text
            else:
                self._id += text
            if word is None:
                return False
            self._state = "id" if word == CALL_ID else "open"
        elif state == "open":
            return self._open(out)
        elif state == "args":
            return self._args(out)
        else:  # between calls: another one, or text again
            if self._may_become(CALLS):
                return False
            self._state = "name" if self._take(CALLS) else "text"
        return True

    def _open(self, out: list[Delta]) -> bool:
        """After `[ARGS]`: the arguments' object opens (blanks before it are skipped);
        anything else was no call, and its text is content again."""
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        if not self._buf.startswith("{"):
            ident = CALL_ID + self._id if self._id else ""
            out.append(Delta("content", CALLS + self._name + ident + ARGS))
            self._name, self._id, self._state = "", "", "text"
            return True
        ident = self._id.strip()
        if ident:  # the id the model sampled, which the template writes back
            out.append(Delta("start", self._name.strip(), self.num_calls, ident))
        else:
            self._start_call(self._name.strip(), out)
        self._json, self._state = JsonNesting(), "args"
        return True

    def _args(self, out: list[Delta]) -> bool:
        for i, ch in enumerate(self._buf):
            self._json.step(ch)
            if self._json.depth == 0 and not self._json.in_string:
                out.append(Delta("args", self._buf[: i + 1], self.num_calls))
                self._buf = self._buf[i + 1 :]
                self.num_calls += 1
                self._name, self._id, self._state = "", "", "between"
                return True
        out.append(Delta("args", self._buf, self.num_calls))
        self._buf = ""
        return False

    def _finish_call(self, out: list[Delta]) -> None:
        if self._state in ("name", "id", "open") and (self._name + self._buf).strip():
            # cut off before its arguments: started, never complete (counted truncated)
            name = self._name if self._state != "name" else self._name + self._buf
            self._start_call(name.partition(ARGS)[0].partition(CALL_ID)[0].strip(), out)


MINISTRAL3 = MinistralFormat("ministral-3", partial(_grammar, call_id=False), MinistralParser)
# Mistral Small 3.2: `[CALL_ID]` and 9 alphanumerics before `[ARGS]`
MISTRAL_SMALL = MinistralFormat(
    "mistral-small-3.2", partial(_grammar, call_id=True), MinistralParser
)
