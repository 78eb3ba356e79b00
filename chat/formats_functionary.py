"""Functionary v3.2: every message names its recipient after `>>>`.

    >>>all
    Let me look.>>>get_weather
    {"city": "Paris"}>>>get_time
    {"city": "Paris"}

The generation prompt ends with the first `>>>`, so the output opens with a recipient:
`all` (then the content, up to the next `>>>`) or a function (then its arguments as one
JSON object). As llama.cpp reads it (common/parsers/functionary-v3-2.cpp, test-chat.cpp's
Functionary v3.2 cases): the template that writes `>>>all` and `>>>${recipient}`; a
recipient that is no offered function is not a call (its message stays content). The
template joins a past call's `arguments` as text, so they reach it as the JSON text of
the mapping (`adapt_messages`).

Differences from llama.cpp, each for a reason: calls after the first, and a call after
content, are written behind their own `>>>`, as the template writes them (llama.cpp's
grammar joins them without it, which its own parser then reads as content); a forced
(`required` / named) reply is the calls alone (llama.cpp's grammar admits an `all`
message first, which nothing but the model's own `>>>` ends); the lazy grammar arms at
an offered function's name and its line break (llama.cpp: at any `>>>` not followed by
`all`, matched against the prompt's end too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    document_rule,
    json_arguments,
    keyed_tools,
)
from chat.callstream import BufferedParser, Delta, JsonNesting
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

ARROW = ">>>"
ALL = "all\n"  # the recipient of content


@dataclass(frozen=True, slots=True)
class FunctionaryFormat(OwnFormat):
    """Its past calls adapted (`TurnAdapter`). No thinking to split, but its parser reads
    every output (the `all` recipient before the content), tools offered or not: what
    `owns_reasoning` (on) asks of the plan."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Past calls' arguments as JSON text: the template writes `'\\n' + arguments`."""
        out = []
        for message in messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls = [{**c, "function": {**c["function"],
                                            "arguments": _as_text(c["function"]["arguments"])}}
                         for c in message["tool_calls"]]  # fmt: skip
                message = {**message, "tool_calls": calls}
            out.append(message)
        return out

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text


def detect_functionary(source: str) -> FunctionaryFormat | None:
    """llama.cpp's rule (common/chat.cpp)."""
    return FUNCTIONARY_V3_2 if ">>>all" in source and ">>>${recipient}" in source else None


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    tools = keyed_tools(key)
    alternatives = []
    for i, tool in enumerate(tools):
        args = json_arguments(rules, i, tool)
        alternatives.append(rules.add(f"call-{i}", f"{literal(tool.name + chr(10))} {ws} {args}"))
    call = rules.add("call", " | ".join(alternatives))
    calls = f"{call} ({literal(ARROW)} {call})*" if parallel else call
    if mode == "auto" and not doc_key:
        names = "|".join(re.escape(t.name + "\n") for t in tools)
        # the first message, or one after the content's `>>>`: the grammar starts at the name
        pattern = rf"(?:[\s\S]*?{re.escape(ARROW)})?({names})[\s\S]*"
        return GrammarSpec(rules.text(calls), lazy=True, trigger_patterns=(pattern,))
    if doc_key:  # auto with a response schema: calls, or the document as the content
        return GrammarSpec(rules.text(f"{calls} | {literal(ALL)} {document_rule(rules, doc_key)}"))
    return GrammarSpec(rules.text(calls))


class FunctionaryParser(BufferedParser):
    """Messages -> content and call deltas, incrementally. A recipient is held until its
    line ends; content streams, holding back a possible partial `>>>`; arguments stream
    until their object closes."""

    def __init__(self, tools: Sequence[Tool], reasoning: bool = True):
        """`reasoning`: the format has no thinking to split."""
        super().__init__()
        self._names = tuple(t.name + "\n" for t in tools)
        self._state = "recipient"  # recipient | content | args | after | plain
        self._first = True  # the recipient is the output's first (the prompt's `>>>`)
        self._json: JsonNesting | None = None
        self._text = ""  # the open call's arguments so far

    def finish(self) -> list[Delta]:
        out = []
        if self._state in ("recipient", "content", "plain") and self._buf:
            out.append(Delta("content", self._buf))
        self._buf = ""  # a call cut off: started, never complete (truncated)
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "plain":
            out.append(Delta("content", self._buf))
            self._buf = ""
            return False
        if self._state == "recipient":
            return self._recipient(out)
        if self._state == "after":
            return self._after()
        if self._state == "content":
            if not self._names:  # no tools: everything after `all` is content
                out.append(Delta("content", self._buf))
                self._buf = ""
                return False
            text, word = self._until((ARROW,))
            out.append(Delta("content", text))
            if word is None:
                return False
            self._state = "recipient"
            return True
        return self._args(out)

    def _recipient(self, out: list[Delta]) -> bool:
        """`all`, an offered function, or (neither) a message that stays content."""
        for word in (ALL, *self._names):
            if self._may_become(word):
                return False
            if self._take(word):
                self._first = False
                if word == ALL:
                    self._state = "content"
                else:
                    self._start_call(word[:-1], out)
                    self._state, self._json, self._text = "args", None, ""
                return True
        if self._first:  # not the format at all (a model that ignores its template)
            self._state = "plain"
        else:  # `>>>` written by no recipient's message: it is content
            out.append(Delta("content", ARROW))
            self._state = "content"
        return True

    def _args(self, out: list[Delta]) -> bool:
        """The arguments' object, up to its closing brace."""
        if self._json is None:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._json = JsonNesting()
        nesting = self._json
        for i, ch in enumerate(self._buf):
            nesting.step(ch)
            if nesting.depth == 0 and not nesting.in_string:
                piece, self._buf = self._buf[: i + 1], self._buf[i + 1 :]
                out.append(Delta("args", piece, self.num_calls))
                self._text += piece
                try:
                    json.loads(self._text)
                except ValueError:
                    pass  # not JSON (no grammar held it): never complete
                else:
                    self.num_calls += 1
                self._state = "after"
                return True
        out.append(Delta("args", self._buf, self.num_calls))
        self._text += self._buf
        self._buf = ""
        return False

    def _after(self) -> bool:
        """After a call: the next `>>>` and recipient; other text is content."""
        if self._may_become(ARROW):
            return False
        if self._take(ARROW):
            self._state = "recipient"
        else:
            self._state = "content"
        return True


FUNCTIONARY_V3_2 = FunctionaryFormat("functionary-v3.2", _grammar, FunctionaryParser)
