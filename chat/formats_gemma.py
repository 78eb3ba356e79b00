"""Gemma 4: calls in its own value syntax, thinking in its thought channel.

    <|channel>thought
    plan<channel|>Sure.<|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>

As llama.cpp reads it (common/parsers/gemma4.cpp, test-chat.cpp's Gemma 4 cases): the
thought channel -> `reasoning_content` (an empty one is what the generation prompt writes
when thinking is off), the text around it -> `content`, each `<|tool_call>call:NAME{..}
<tool_call|>` -> a call, its arguments read from Gemma's syntax into JSON
(chat/gemma_values.py). A stray `<|channel>` or `<channel|>` (the model sometimes ends
with one) is dropped. The parser splits the thinking itself (owns_reasoning). A call is
released when it closes; one cut off is reported as started, so it counts as truncated.

The prompt, as llama.cpp's handler makes it (`TurnAdapter`): the older template (the
`-interleaved` one, without the "OpenAI Chat Completions" branch) reads tool results
only as the `tool_responses` of the assistant turn that called, so role:tool messages
are folded there; a turn that ended in text after its results gets `<|turn>model\\n`
as its generation prompt (the template writes none after tool results).
"""

from __future__ import annotations

import json
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
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.gemma_values import QUOTE, GemmaSyntaxError, GemmaValues, gemma_json
from chat.tools import INPUT, Tool

log = logging.getLogger("kvserve.chat")

CHANNEL_OPEN, CHANNEL_CLOSE, THOUGHT = "<|channel>", "<channel|>", "thought"
CALL_OPEN, CALL_CLOSE, CALL = "<|tool_call>", "<tool_call|>", "call:"
TURN_OPEN = "<|turn>model\n"
DETECT = "'<|tool_call>call:'"  # llama.cpp's test: how the template writes a call
CURRENT = "{#- OpenAI Chat Completions:"  # the template that reads role:tool itself
# The name of the call a text turn followed by tool results is written as, so that the
# template frames its text as it frames calls (`fold_tool_results`); never a tool's name.
_AS_CALL = "\x00kvserve-text\x00"


@dataclass(frozen=True, slots=True)
class GemmaFormat(OwnFormat):
    """Its conversation and prompt adapted (`TurnAdapter`)."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return fold_tool_results(messages, older=CURRENT not in source)

    def adapt_prompt(self, text: str, generation: bool) -> str:
        """A text turn written as a call (`fold_tool_results`) as its text alone; after a
        turn with text following its tool results the template writes no generation
        prompt, and llama.cpp opens the model's turn (its gemma4.cpp)."""
        opener = CALL_OPEN + CALL + _AS_CALL + "{"
        while (at := text.find(opener)) >= 0:
            end = text.find("}" + CALL_CLOSE, at)
            if end < 0:
                break
            text = text[:at] + text[at + len(opener) : end] + text[end + len("}" + CALL_CLOSE) :]
        if generation and text.endswith("<turn|>\n"):
            return text + TURN_OPEN
        return text


def detect_gemma(source: str) -> GemmaFormat | None:
    return GEMMA4 if DETECT in source else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    values = GemmaValues(rules)
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        if tool.grammar is not None:  # a custom tool: {input:<|"|>TEXT<|"|>}
            text = input_grammar(rules, i, tool.grammar, json_text=False)
            args = f"{literal('{' + INPUT + ':' + QUOTE)} {text} {literal(QUOTE + '}')}"
        else:
            args = values.arguments(tool.parameters, f"t{i}-")
        alternatives.append(rules.add(f"call-{i}", f"{literal(tool.name)} {args}"))
    call = rules.add("call", f"{literal(CALL_OPEN + CALL)} ({' | '.join(alternatives)}) "
                             f"{literal(CALL_CLOSE)}")  # fmt: skip
    calls = f"{call}+" if parallel else call
    return lazy_or_forced(rules, calls, mode, doc_key, CALL_OPEN, CHANNEL_CLOSE,
                          literal(CHANNEL_OPEN + THOUGHT))  # fmt: skip


class GemmaParser(BufferedParser):
    """Channels and calls -> reasoning / content / calls, incrementally; text that may
    still be a marker is held back until it resolves."""

    def __init__(self, tools: Sequence[Tool], reasoning: bool):
        super().__init__()
        self._words = ((CALL_OPEN,) if tools else ()) + (
            (CHANNEL_OPEN, CHANNEL_CLOSE) if reasoning else ()
        )
        self._state = "start"
        self._call = ""  # the call's text so far, after `<|tool_call>`
        self._in_string = False

    def _step(self, out: list[Delta]) -> bool:
        state = self._state
        if state == "start":  # a turn the model opened again itself (after tool results)
            if self._may_become(TURN_OPEN):
                return False
            self._take(TURN_OPEN)
            self._state = "text"
        elif state == "text":
            text, word = self._until(self._words)
            out.append(Delta("content", text))
            if word is None:
                return False
            self._state = {CALL_OPEN: "call", CHANNEL_OPEN: "channel"}.get(word, "text")
        elif state == "channel":
            if self._may_become(THOUGHT):
                return False
            # else a stray `<|channel>`: dropped
            self._state = "blank" if self._take(THOUGHT) else "text"
        elif state == "blank":
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = "thought"
        elif state == "thought":
            text, word = self._until((CHANNEL_CLOSE,))
            out.append(Delta("reasoning", text))
            if word is None:
                return False
            self._state = "text"
        else:
            return self._call_step(out)
        return True

    def _call_step(self, out: list[Delta]) -> bool:
        """Inside a call: up to `<tool_call|>`, which a string may hold."""
        text, word = self._until((QUOTE,) if self._in_string else (QUOTE, CALL_CLOSE))
        self._call += text
        if word is None:
            return False
        if word == QUOTE:
            self._call += word
            self._in_string = not self._in_string
            return True
        self._end_call(out)
        self._call, self._state = "", "text"
        return True

    def _end_call(self, out: list[Delta]) -> None:
        head, brace, rest = self._call.partition("{")
        name = head.strip().removeprefix(CALL)
        try:
            args = gemma_json(brace + rest)
        except GemmaSyntaxError as exc:
            log.debug("a Gemma 4 call not read (%s): %r", exc, self._call)
            return  # not a call (no grammar held it): nothing to report
        if not name or not isinstance(args, dict):
            return
        self._whole_call(name, args, out)

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("start", "text") and self._buf:
            out.append(Delta("content", self._buf))
        elif self._state in ("blank", "thought") and self._buf:
            out.append(Delta("reasoning", self._buf))
        elif self._state == "call":
            name = (self._call + self._buf).partition("{")[0].strip().removeprefix(CALL)
            if name:  # cut off: started, never complete (the plan counts it truncated)
                self._start_call(name, out)
        self._buf = ""
        return out


GEMMA4 = GemmaFormat("gemma4", _grammar, GemmaParser)


def fold_tool_results(messages: list[dict[str, Any]], older: bool) -> list[dict[str, Any]]:
    """Tool results as the `tool_responses` of the assistant turn that called, for the
    older template, which reads no role:tool message (with the text of a plain assistant
    turn right after the results, as llama.cpp's convert_tool_responses_gemma4 does).

    A turn with text and no calls followed by results is a replayed turn (chat/replay.py:
    its text is a mark the sampled calls replace): both templates would drop its results
    (they read results only after calls) or put them before its text, so its text is
    written as the arguments of a call named `_AS_CALL`, which `adapt_prompt` unwraps:
    the text stands where the calls stood, the results follow it."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        calls = message.get("tool_calls")
        following = i < len(messages) and messages[i].get("role") == "tool"
        if message.get("role") != "assistant" or not following:
            out.append(message)
            continue
        if not calls and isinstance(message.get("content"), str):
            as_call = {"type": "function",
                       "function": {"name": _AS_CALL, "arguments": message["content"]}}  # fmt: skip
            message = {**message, "content": None, "tool_calls": [as_call]}
            calls = message["tool_calls"]
        if not older:
            out.append(message)
            continue
        responses = []
        while i < len(messages) and messages[i].get("role") == "tool":
            responses.append(_response(messages[i]))
            i += 1
        turn = {**message, "tool_responses": responses}
        nxt = messages[i] if i < len(messages) else None
        if calls and nxt and nxt.get("role") == "assistant" and not nxt.get("tool_calls") \
                and nxt.get("content"):  # fmt: skip
            turn["content"] = nxt["content"]
            i += 1
        out.append(turn)
    return out


def _response(message: dict[str, Any]) -> dict[str, Any]:
    """A role:tool message as Gemma's {name, response}: the content read as JSON where
    it is JSON, else the text (llama.cpp's collect_result)."""
    content = message.get("content")
    response: Any = content
    if isinstance(content, str):
        try:
            response = json.loads(content)
        except ValueError:
            response = content
    name = message.get("name") or message.get("tool_call_id") or ""
    return {"name": name, "response": response}
