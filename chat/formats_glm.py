"""GLM 4.5 / 4.6 / 4.7's tagged calls, each argument a key and a value:

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

(GLM 4.7 Flash writes the same tags without the newlines). The templates write a string
value as its text and any other value as JSON (`v | tojson if v is not string`), so a
value is typed back as Qwen3-Coder's XML values are (chat/tagged_args.py): raw text
where the schema admits only strings, else JSON when it parses as a type the schema
admits. Required arguments come first in any order, then optional ones. In `required`
/ named mode the grammar lets the thinking come first (GLM 4.7 opens `<think>` in the
prompt; GLM 4.6 writes it itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    keyed_tools,
    starts_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BlockParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tagged_args import Tags, TypedArgs, tagged_arguments
from chat.tools import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@dataclass(frozen=True, slots=True)
class GlmFormat(MemoizedGrammar):
    name: str
    nl: str  # "\n" after the name and each tag pair (GLM 4.5/4.6), "" (GLM 4.7 Flash)
    native: bool = True
    owns_reasoning: bool = False

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return GlmParser(tools)


GLM_45 = GlmFormat("glm-4.5", "\n")
GLM_47 = GlmFormat("glm-4.7", "")


def detect_glm(source: str) -> GlmFormat | None:
    """`<tool_call>` with `<arg_key>` / `<arg_value>` tags (also Ling 3, Spark 2.5 and
    Poolside Laguna); the newline form when the template writes a newline after the
    key's end tag (itself, or `\\n` in a string), else the compact one."""
    if not all(tag in source for tag in (OPEN, KEY, VALUE)):
        return None
    return GLM_45 if KEY_END + "\n" in source or KEY_END + "\\n" in source else GLM_47


def _grammar(fmt: GlmFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    alternatives = []

    def param(name: str, value: str) -> str:
        head = literal(KEY + name + KEY_END + fmt.nl + VALUE)
        return f"{head} {value} {literal(VALUE_END + fmt.nl)}"

    tags = Tags(param, VALUE_END, "glm-text")
    for i, tool in enumerate(keyed_tools(key)):
        args = tagged_arguments(rules, i, tool, tags)
        head = literal(OPEN + tool.name + fmt.nl)
        alternatives.append(rules.add(f"call-{i}", f"{head} {args} {literal(CLOSE)}".strip()))
    call = rules.add("call", " | ".join(alternatives))
    sep = f"{literal(fmt.nl)} " if fmt.nl else ""
    calls = f"{call} ({sep}{call})*" if parallel else call
    if mode == "auto" and not doc_key:
        return GrammarSpec(rules.text(calls), lazy=True, trigger_patterns=(starts_at(OPEN),))
    think = thinking_block(rules, "</think>", '"\\n"? "<think>"?', '"\\n"?')
    return thinking_then(rules, think, rules.add("calls", calls), doc_key)


class GlmParser(BlockParser):
    """Splits output into content and calls, incrementally; text that may still open a
    call is held back, each argument's value is typed once it closes."""

    def __init__(self, tools: Sequence[Tool]):
        super().__init__()  # states: text | name | args | key | value
        self._args = TypedArgs(tools)
        self._key = ""
        self._between = False

    def _block_step(self, out: list[Delta]) -> bool:
        if self._state == "name":
            ends = [at for at in (self._buf.find(c) for c in ("\n", KEY, CLOSE)) if at >= 0]
            if not ends:
                return False
            name, self._buf = self._buf[: min(ends)].strip(), self._buf[min(ends) :]
            self._start_call(name, out)
            out.append(Delta("args", self._args.open(name), self.num_calls))
            self._state = "args"
            return True
        if self._state == "args":
            return self._arg_tags(out)
        end = KEY_END if self._state == "key" else VALUE_END
        at = self._buf.find(end)
        if at < 0:
            return False
        text, self._buf = self._buf[:at], self._buf[at + len(end) :]
        if self._state == "key":
            self._key = text.strip()
        else:
            out.append(Delta("args", self._args.add(self._key, text), self.num_calls))
        self._state = "args"
        return True

    def _text(self, out: list[Delta]) -> bool:
        if self._between:  # the newline between calls is no content
            self._buf = self._buf.lstrip()
            self._between = not self._buf
            if self._between:
                return False
        text, start = self._until((OPEN,))
        out.append(Delta("content", text))
        if start is None:
            return False
        self._state = "name"
        return True

    def _arg_tags(self, out: list[Delta]) -> bool:
        self._buf = self._buf.lstrip()
        for tag, state in ((KEY, "key"), (VALUE, "value")):
            if self._buf.startswith(tag):
                self._buf, self._state = self._buf[len(tag) :], state
                return True
        if self._buf.startswith(CLOSE):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._buf, self._state, self._between = self._buf[len(CLOSE) :], "text", True
            return True
        if not self._buf or any(t.startswith(self._buf) for t in (KEY, VALUE, CLOSE)):
            return False
        self._buf = self._buf[1:]  # stray text inside a call (no grammar held it): skipped
        return True
