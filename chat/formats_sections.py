"""Calls in a section of special tokens, each a header naming the function and then its
arguments as one JSON object (DeepSeek V3.1 / R1, Kimi K2):

    DeepSeek V3.1  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}
                   <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
    DeepSeek R1    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                   ```json
                   {..}
                   ```<｜tool▁call▁end｜>\\n<｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>
    Kimi K2        <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
                   <|tool_call_argument_begin|>{..}<|tool_call_end|>...<|tool_calls_section_end|>

(each call is one line; IDX counts the calls of the conversation). As llama.cpp
reads them (test-chat.cpp's cases; common/parsers/kimi-k2.cpp): text before the section
is content; a call's closing tokens, the R1 code fence and the section's end are
optional; Kimi may leave out the section tokens and call from inside its thinking, so
its parser splits `<think>` itself. Kimi's ids: llama.cpp reports `functions.NAME:IDX`;
kvserve issues its own unique ids (the templates recompute IDX from the conversation).

In `required` / named mode the grammar lets thinking come first (the DeepSeek templates
open `<think>` in the prompt when thinking is on; Kimi writes it itself), so a forced
call does not land inside the reasoning. The grammar reads the prompt it follows
(`for_prompt`, a PromptBound format): where DeepSeek V3.1's prompt closed the thinking
(`<｜Assistant｜><think></think>`, thinking off) a thinking block must open with a
literal `<think>`, as llama.cpp's grammar has it (text up to `</think>` would let a model
write prose until max_tokens); and Kimi's call index is the conversation's next one, as
its template counts the calls (the first call of a turn: exact; parallel calls after it
any number, which GBNF cannot count).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    json_arguments,
    keyed_tools,
    lazy_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BufferedParser, Delta, JsonNesting
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class SectionFormat(MemoizedGrammar):
    name: str
    section_open: str
    section_close: str
    call_open: str
    head: str  # after call_open, before the JSON: "{name}" and "{index}" are filled in
    call_close: str  # after the JSON
    separator: str  # between calls, as the template writes it
    head_pattern: str  # the parser's regex for a head (group "name"), up to the JSON
    trailer: tuple[str, ...]  # what may come after the JSON (all optional when parsed)
    think_open: str  # thinking the grammar lets come first: "<think>", or "" (prompt-opened)
    lazy_from_call: bool = False  # the lazy grammar starts at a call, not at the section
    owns_reasoning: bool = False  # calls may come from inside `<think>`: split here
    native: bool = True
    # Set by `for_prompt`: the index the turn's first call gets (None: any), and whether
    # a prompt-opened thinking was closed by the prompt (then only `<think>` opens one).
    first_index: int | None = None
    think_closed: bool = False

    def for_prompt(self, prompt: str) -> SectionFormat:
        """This format's grammar for a turn that follows `prompt`."""
        closed = not self.think_open and not prompt.rstrip().endswith(THINK_OPEN)
        index = prompt.count(self.call_open) if "{index}" in self.head else None
        return replace(self, first_index=index, think_closed=closed)

    def bound_to(self) -> str:
        return f"{self.first_index}|{self.think_closed}"

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return SectionParser(self, calls=bool(tools), reasoning=reasoning and self.owns_reasoning)

    @property
    def trigger(self) -> str:
        return self.call_open if self.lazy_from_call else self.section_open


_DS_CALL, _DS_SEP, _DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_V3 = SectionFormat(
    "deepseek-v3.1", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", _DS_CALL,
    "{name}" + _DS_SEP, _DS_CALL_END, "",
    r"\s*(?P<name>[^<]+?)\s*" + re.escape(_DS_SEP) + r"\s*", (_DS_CALL_END,), "",
)  # fmt: skip
DEEPSEEK_R1 = SectionFormat(
    "deepseek-r1", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", _DS_CALL,
    "function" + _DS_SEP + "{name}\n```json\n", "\n```" + _DS_CALL_END, "\n",
    r"\s*\w*" + re.escape(_DS_SEP) + r"(?P<name>[^\n`]+?)\s*(?:```(?:json)?)?\s*",
    ("```", _DS_CALL_END), "",
)  # fmt: skip
_KIMI_ARGS = "<|tool_call_argument_begin|>"
KIMI_K2 = SectionFormat(
    "kimi-k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "functions.{name}:{index}" + _KIMI_ARGS, "<|tool_call_end|>", "",
    r"\s*(?:functions\.)?(?P<name>[^<]+?)(?::\d+)?\s*" + re.escape(_KIMI_ARGS) + r"\s*",
    ("<|tool_call_end|>",), THINK_OPEN, lazy_from_call=True, owns_reasoning=True,
)  # fmt: skip


def detect_sections(source: str) -> SectionFormat | None:
    """Kimi K2 by its section tokens (llama.cpp's rule); DeepSeek by its calls token, R1
    when the template fences the arguments in ```json (V3.1 writes them bare). A DeepSeek
    template that writes the arguments without `tojson` (R1 Distill Llama 8B: it joins
    them as a string, and writes calls only when the content is null) cannot render the
    calls kvserve sends back: it keeps the generic envelope (llama.cpp tests it for
    reasoning only)."""
    if "<|tool_calls_section_begin|>" in source and "<|tool_call_begin|>" in source:
        return KIMI_K2
    if "<｜tool▁calls▁begin｜>" in source and "tojson" in source:
        return DEEPSEEK_R1 if "```json" in source else DEEPSEEK_V3
    return None


def _grammar(fmt: SectionFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    tools = keyed_tools(key)
    args = [json_arguments(rules, i, tool) for i, tool in enumerate(tools)]

    def call_rule(name: str, index: str) -> str:
        alternatives = []
        for i, tool in enumerate(tools):
            head = f" {index} ".join(
                literal(part) for part in (fmt.call_open + fmt.head.replace("{name}", tool.name)
                                           ).split("{index}"))  # fmt: skip
            body = f"{head} {args[i]} {literal(fmt.call_close)}"
            alternatives.append(rules.add(f"{name}-{i}", body))
        return rules.add(name, " | ".join(alternatives))

    any_call = call_rule("call", "[0-9]{1,4}")
    first = any_call
    if fmt.first_index is not None:
        first = call_rule("first-call", literal(str(fmt.first_index)))
    sep = f"{literal(fmt.separator)} " if fmt.separator else ""
    calls = f"{first} ({sep}{any_call})*" if parallel else first
    close = literal(fmt.section_close)
    lazy = mode == "auto" and not doc_key
    if lazy and fmt.lazy_from_call:  # the section's opening (if any) was free text
        return lazy_at(rules.text(f"{calls} {close}?"), fmt.trigger)
    section_open = literal(fmt.section_open)
    if fmt.lazy_from_call:  # Kimi: the section tokens are optional (llama.cpp's grammar)
        section = rules.add("section", f"{section_open}? {calls} {close}?")
    else:
        section = rules.add("section", f"{section_open} {calls} {close}")
    if lazy:
        return lazy_at(rules.text(section), fmt.trigger)
    think_open = THINK_OPEN if fmt.think_closed else fmt.think_open
    think = thinking_block(rules, THINK_CLOSE, literal(think_open) if think_open else "")
    return thinking_then(rules, think, section, doc_key)


class SectionParser(BufferedParser):
    """Output -> reasoning / content / call deltas, incrementally. Text that may still
    open a section (or a call, or end the thinking) is held back until it resolves; a
    call's arguments stream as they arrive."""

    def __init__(self, fmt: SectionFormat, *, calls: bool, reasoning: bool):
        super().__init__()
        self._fmt = fmt
        self._head = re.compile(fmt.head_pattern)
        self._starts = (fmt.section_open, fmt.call_open) if calls else ()
        self._state = "start" if reasoning else "text"  # start|think|text|head|args|between
        self._json = JsonNesting()

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("start", "text"):
            out.append(Delta("content", self._buf))
        elif self._state == "head":  # a call opened but never named: the text it was
            out.append(Delta("content", self._fmt.call_open + self._buf))
        elif self._state == "think":
            out.append(Delta("reasoning", self._buf))
        self._buf = ""
        return [d for d in out if d.text]

    def _step(self, out: list[Delta]) -> bool:
        """One move; False when more text is needed."""
        if self._state == "start":
            return self._start()
        if self._state == "think":
            return self._think(out)
        if self._state == "text":
            return self._text(out)
        if self._state == "head":
            return self._open_call(out)
        if self._state == "args":
            return self._args(out)
        return self._between()

    def _start(self) -> bool:
        stripped = self._buf.lstrip()
        if stripped.startswith(THINK_OPEN):
            self._buf, self._state = stripped[len(THINK_OPEN) :], "think"
            return True
        if THINK_OPEN.startswith(stripped):
            return False
        self._state = "text"
        return True

    def _think(self, out: list[Delta]) -> bool:
        text, end = self._until((THINK_CLOSE, *self._starts))
        out.append(Delta("reasoning", text))
        if end is None:
            return False
        if end != THINK_CLOSE:  # a call from inside the thinking: the thinking ends there
            self._buf = end + self._buf  # (llama.cpp's reading), the call stays to be read
        self._buf, self._state = self._buf.lstrip("\n"), "text"
        return True

    def _text(self, out: list[Delta]) -> bool:
        text, start = self._until(self._starts)
        out.append(Delta("content", text))
        if start is None:
            return False
        self._state = "between" if start == self._fmt.section_open else "head"
        return True

    def _open_call(self, out: list[Delta]) -> bool:
        at = self._buf.find("{")
        if at < 0:
            return False
        match = self._head.fullmatch(self._buf[:at])
        if match is None:  # not a call after all: what was read is text
            out.append(Delta("content", self._fmt.call_open + self._buf[:at]))
            self._buf, self._state = self._buf[at:], "text"
            return True
        self._start_call(match.group("name"), out)
        self._buf, self._state = self._buf[at:], "args"
        self._json = JsonNesting()
        return True

    def _args(self, out: list[Delta]) -> bool:
        """Copy the JSON object's text until its closing brace."""
        for i, ch in enumerate(self._buf):
            self._json.step(ch)
            if ch in "}]" and not self._json.in_string and self._json.depth == 0:
                out.append(Delta("args", self._buf[: i + 1], self.num_calls))
                self.num_calls += 1
                self._buf, self._state = self._buf[i + 1 :], "between"
                return True
        out.append(Delta("args", self._buf, self.num_calls))
        self._buf = ""
        return False

    def _between(self) -> bool:
        """After a call (or the section's opening): its optional closing pieces, then
        another call, the section's end, or text again."""
        self._buf = self._buf.lstrip()
        for piece in self._fmt.trailer:
            if self._buf.startswith(piece):
                self._buf = self._buf[len(piece) :]
                return True
        if self._buf.startswith(self._fmt.call_open):
            self._buf, self._state = self._buf[len(self._fmt.call_open) :], "head"
            return True
        if self._buf.startswith(self._fmt.section_close):
            self._buf, self._state = self._buf[len(self._fmt.section_close) :], "text"
            return True
        words = (*self._fmt.trailer, self._fmt.call_open, self._fmt.section_close)
        if not self._buf or any(w.startswith(self._buf) for w in words):
            return False
        self._state = "text"
        return True
