"""gpt-oss's harmony format: the reply is a sequence of messages, each with a header.

The generation prompt ends with `<|start|>assistant`, so the output reads like

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer

and a call names its recipient in the role header or in the channel header:

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}

As llama.cpp reads it (common/parsers/gpt-oss.cpp): analysis -> reasoning, final and
commentary without a recipient (a preamble) -> content, `to=functions.NAME` -> a call;
a call to any other recipient (a builtin tool: `to=python`, `to=container.exec`) is
dropped. `<|call|>` and `<|return|>` end the generation; the parser ignores them if
they reach it. One call per reply: `<|call|>` ends it (and the template renders one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    excluding,
    json_arguments,
    keyed_tools,
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ENDINGS = (END, "<|call|>", "<|return|>")
# How a message's header may begin: right after the prompt's `<|start|>assistant`, or
# with the next `<|start|>`. Output that begins otherwise is plain text.
HEADER_STARTS = (CHANNEL, " to=", START)
_RECIPIENT = re.compile(r"to=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>(\w+)")
# The grammar starts at the recipient, in the role header or in the channel header.
_PREFIX = r"(?:[\s\S]*?<\|start\|>assistant)?"
TRIGGERS = (
    _PREFIX + r"( to=functions)[\s\S]*",
    _PREFIX + r"(<\|channel\|>(?:commentary|analysis) to=functions)[\s\S]*",
)


@dataclass(frozen=True, slots=True)
class HarmonyFormat(MemoizedGrammar):
    name: str = "harmony"
    native: bool = True
    owns_reasoning: bool = True

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        # `parallel` changes nothing: `<|call|>` ends the reply, one call per turn.
        return _grammar(key, mode, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return HarmonyParser(calls=bool(tools), reasoning=reasoning)

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A turn with text and no calls followed by results is a replayed turn
        (chat/replay.py: its text is a mark the sampled call replaces). The template
        writes such a turn in the final channel and refuses the results after it (it
        names a result by the call before it), so the turn becomes a call to the
        function the result names, its text in the arguments and `_AS_TEXT` as the
        content type, which `adapt_prompt` unwraps: `<|start|>assistant`, the text
        (the sampled turn, from the prompt's own header on), then the template's
        `<|call|>` and results as it writes them after a call."""
        out = []
        for i, message in enumerate(messages):
            after = messages[i + 1] if i + 1 < len(messages) else {}
            content = message.get("content")
            if (message.get("role") == "assistant" and not message.get("tool_calls")
                    and after.get("role") == "tool" and isinstance(content, str)):  # fmt: skip
                function = {"name": after.get("name") or "", "arguments": content,
                            "content_type": _AS_TEXT}  # fmt: skip
                message = {"role": "assistant", "tool_calls": [{"type": "function",
                                                                "function": function}]}  # fmt: skip
            out.append(message)
        return out

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return _AS_TEXT_CALL.sub(lambda m: START + "assistant" + json.loads(m[1]), text)


HARMONY = HarmonyFormat()
# The content type a replayed text turn's call is written with (never a real one), and
# how the template writes that call: `tool_call.arguments|tojson` is the text as JSON.
_AS_TEXT = "kvserve-text"
_AS_TEXT_CALL = re.compile(
    r"<\|start\|>assistant to=functions\.[^<]*<\|channel\|>commentary "
    + re.escape(_AS_TEXT)
    + r"<\|message\|>(\"(?:[^\"\\]|\\.)*\")(?=<\|call\|>)"
)


def _grammar(key: str, mode: str, doc_key: str) -> GrammarSpec:
    """Under required / named the grammar starts at the call's header: no analysis or
    commentary message may come first. llama.cpp's required grammar admits any number
    of both (`zero_or_more(start + (preamble | analysis)) + start + tool_call`), each
    ended only by the model's own `<|end|>`; a model that does not close one (SmolLM2
    served with this template: tests/integration/test_family_dialects.py) writes until
    max_tokens and no call comes back, and a bound on a message's length short enough to
    help it would cut a real gpt-oss's reasoning anyway. The cost: gpt-oss does not
    reason before a forced call (it does in auto, the agents' mode); the call itself
    may still be written in the analysis channel (`<|channel|>analysis to=functions.X`)."""
    rules = RuleSet()
    channel = rules.add("channel", f'{literal(CHANNEL)} ("commentary" | "analysis")')
    constrain = literal("<|constrain|>")
    constraint = rules.add("constraint", f'(" "? {constrain}? [A-Za-z0-9_-]{{1,16}})?')
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args = json_arguments(rules, i, tool)
        to = literal(f" to=functions.{tool.name}")
        message = literal(MESSAGE)
        alternatives.append(rules.add(
            f"call-{i}",
            f"{to} {channel} {constraint} {message} {args} | "
            f"{channel} {to} {constraint} {message} {args}",
        ))  # fmt: skip
    call = rules.add("call", " | ".join(alternatives))
    if mode == "auto" and not doc_key:
        return GrammarSpec(rules.text(call), lazy=True, trigger_patterns=TRIGGERS)
    if not doc_key:  # required / named: the reply is the call, from its header on
        return GrammarSpec(rules.text(call))
    # auto with a response schema: analysis messages, then a call or a final message
    # matching the schema (llama.cpp's response-format grammar: analysis only before it)
    text = excluding(rules, "message-text", END)
    stray = f"({literal(CHANNEL + 'commentary')} {literal(' to=assistant')}?)?"
    analysis = f"{stray} {literal(CHANNEL + 'analysis' + MESSAGE)} {text} {literal(END)}"
    earlier = rules.add("earlier", f"{analysis} {literal(START + 'assistant')}")
    value = document_rule(rules, doc_key)
    final = f"{literal(CHANNEL + 'final')} {constraint} {literal(MESSAGE)} {value}"
    return GrammarSpec(rules.text(f"{earlier}* ({call} | {final})"))


class HarmonyParser(BufferedParser):
    """Messages -> reasoning / content / call deltas, incrementally. A header is held
    until its `<|message|>`; a body streams, holding back a possible partial ending."""

    def __init__(self, *, calls: bool, reasoning: bool):
        super().__init__()
        self._calls = calls
        self._reasoning = reasoning
        self._state = "header"  # header | body | plain
        self._kind = "content"  # the body's: content | reasoning | args | drop
        self._args = ""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state == "plain" or (self._state == "header" and self._buf):
            out.append(Delta("content", self._buf))
        elif self._state == "body":
            self._emit(self._buf, out)
            self._end_body(out)
        self._buf = ""
        return [d for d in out if d.text]

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "plain":
            out.append(Delta("content", self._buf))
            self._buf = ""
            return False
        if self._state == "header":
            return self._header(out)
        text, ending = self._until(ENDINGS)
        self._emit(text, out)
        if ending is None:
            return False
        self._end_body(out)
        self._state = "header"
        return True

    def _header(self, out: list[Delta]) -> bool:
        if not self._buf:
            return False
        if not any(self._buf.startswith(s) or s.startswith(self._buf) for s in HEADER_STARTS):
            self._state = "plain"  # not harmony at all (a model that ignores its template)
            return True
        at = self._buf.find(MESSAGE)
        if at < 0:
            return False
        header, self._buf = self._buf[:at], self._buf[at + len(MESSAGE) :]
        self._open(header.removeprefix(START + "assistant"), out)
        self._state = "body"
        return True

    def _open(self, header: str, out: list[Delta]) -> None:
        channels = _CHANNEL.findall(header)
        channel = channels[-1] if channels else ""
        recipient = next(
            (r for r in _RECIPIENT.findall(header) if r != "assistant"), None)  # fmt: skip
        if recipient is not None:
            function = recipient.removeprefix("functions.")
            if recipient.startswith("functions.") and self._calls:
                self._kind, self._args = "args", ""
                self._start_call(function, out)
            else:
                self._kind = "drop"  # a builtin tool, or a call when none was offered
        elif channel == "analysis" and self._reasoning:
            self._kind = "reasoning"
        elif channel == "analysis":  # reasoning_format none: the message as it was written
            self._kind = "raw-analysis"
            out.append(Delta("content", header + MESSAGE))
        else:
            self._kind = "content"

    def _emit(self, text: str, out: list[Delta]) -> None:
        if not text or self._kind == "drop":
            return
        if self._kind == "args":
            self._args += text
            out.append(Delta("args", text, self.num_calls))
        elif self._kind == "reasoning":
            out.append(Delta("reasoning", text))
        else:
            out.append(Delta("content", text))

    def _end_body(self, out: list[Delta]) -> None:
        if self._kind == "raw-analysis":
            out.append(Delta("content", END))
        if self._kind == "args":
            try:
                json.loads(self._args)
            except ValueError:
                pass  # cut off (max_tokens): never complete, the planner drops it
            else:
                self.num_calls += 1
        self._kind = "content"
