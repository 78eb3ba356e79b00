"""Qwen3-Coder's XML calls (also Qwen3.5, Nemotron 3 Nano, StepFun 3.5 Flash):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

As llama.cpp reads them (common/parsers/qwen3-coder.cpp): each parameter's value is raw
text or JSON by its schema, required parameters first in any order (chat/tagged_args.py).
Seed-OSS writes the same calls in `<seed:tool_call>` with each value tight inside its
tags (`<parameter=KEY>VALUE</parameter>`), and thinks in `<seed:think>`: the same format
with other tags (SEED_OSS, the syntax llama.cpp's autoparser derives from its renders),
whose parser splits its own thinking and whose forced grammar lets the thinking come
first.
Qwen3-Coder (the template without `<think>`) sometimes leaves out the first call's
`<tool_call>`: the grammar allows that and a `<function=NAME>` of an offered tool also
arms the lazy grammar. A tool with an input grammar (a custom tool) takes its one string
parameter as raw text held to that grammar; the grammar cannot also keep
`\n</parameter>\n` out of it, so an input holding that line would end at it when parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    keyed_tools,
    starts_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import BlockParser, Delta
from chat.gbnf import RuleSet, literal
from chat.reasoning import SEED_THINKING, ThinkingSyntax, ThinkingThenCalls
from chat.tagged_args import Tags, TypedArgs, tagged_arguments
from chat.tools import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION = "<function="
VALUE_END = "\n</parameter>\n"


@dataclass(frozen=True, slots=True)
class XmlFormat(MemoizedGrammar):
    name: str
    bare_first: bool  # the first call may come without its <tool_call> (Qwen3-Coder)
    native: bool = True
    owns_reasoning: bool = False
    open: str = OPEN  # a call's tags around <function=NAME>
    close: str = CLOSE
    value_head: str = "\n"  # between <parameter=KEY> and the value
    value_end: str = VALUE_END  # what ends a value (a value's raw text cannot hold it)
    value_tail: str = ""  # what the grammar writes after value_end
    think: ThinkingSyntax | None = None  # the format's own thinking block (owns_reasoning)

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        calls = XmlCallParser(self, tools)
        return ThinkingThenCalls(self.think, calls) if self.think and reasoning else calls


QWEN3_CODER = XmlFormat("qwen3-coder", bare_first=True)
QWEN3_XML = XmlFormat("qwen3-xml", bare_first=False)  # the thinking templates
SEED_OSS = XmlFormat(
    "seed-oss", bare_first=False, owns_reasoning=True, open="<seed:tool_call>",
    close="</seed:tool_call>", value_head="", value_end="</parameter>", value_tail="\n",
    think=SEED_THINKING,
)  # fmt: skip


def detect_xml(source: str) -> XmlFormat | None:
    """llama.cpp's rule (common/chat.cpp): `<tool_call>`, `<function=` and `<parameter=`
    in the template, except templates that write `<tool_call><function=` without the
    newlines between them. Seed-OSS: `<seed:tool_call>` and `<function=`."""
    if SEED_OSS.open in source and FUNCTION in source:
        return SEED_OSS
    if not all(tag in source for tag in (OPEN, FUNCTION, "<parameter=")):
        return None
    if "'<tool_call><function=' ~ tool_call.name ~ '>'" in source:
        return None
    return QWEN3_XML if "<think>" in source else QWEN3_CODER


def _grammar(fmt: XmlFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    close = literal(fmt.value_end + fmt.value_tail)
    names = []
    alternatives = []

    def param(name: str, value: str) -> str:
        opener = literal(f"<parameter={name}>{fmt.value_head}")
        return f"{opener} {value} {close}"

    tags = Tags(param, fmt.value_end, "xml-arg-text")
    for i, tool in enumerate(keyed_tools(key)):
        names.append(tool.name)
        args = tagged_arguments(rules, i, tool, tags)
        head, tail = literal(f"{FUNCTION}{tool.name}>\n"), literal("</function>\n")
        alternatives.append(rules.add(f"call-{i}", " ".join(p for p in (head, args, tail) if p)))
    opener = literal(fmt.open + "\n")
    body = rules.add("call-body", f"({' | '.join(alternatives)}) {literal(fmt.close)} {ws}")
    call = rules.add("call", f"{opener} {body}")
    first = rules.add("call-first", f"({opener})? {body}") if fmt.bare_first else call
    root = f"{first} {call}*" if parallel else first
    lazy = mode == "auto"
    if fmt.think is not None and not (lazy and not doc_key):  # a forced answer
        think = thinking_block(rules, fmt.think.close, literal(fmt.think.open), ws)
        return thinking_then(rules, think, root, doc_key)
    if doc_key:  # calls | the document: no longer free text, so not lazy
        value = document_rule(rules, doc_key)
        root, lazy = f"({root}) | {value}", False
    starts = [fmt.open] + ([f"{FUNCTION}{n}>" for n in names] if fmt.bare_first else [])
    patterns = tuple(starts_at(s) for s in starts)
    return GrammarSpec(rules.text(root), lazy=lazy, trigger_patterns=patterns if lazy else ())


class XmlCallParser(BlockParser):
    """Splits output into content and XML calls, incrementally. Text that may still
    open a call is held back; each parameter's value is typed once it closes."""

    def __init__(self, fmt: XmlFormat, tools: Sequence[Tool]):
        super().__init__()  # states: text | open | params | value | close
        self._fmt = fmt
        self._args = TypedArgs(tools)
        self._starts = [fmt.open] + (
            [f"{FUNCTION}{t.name}>" for t in tools] if fmt.bare_first else [])  # fmt: skip
        self._param = ""
        self._between = False

    def _block_step(self, out: list[Delta]) -> bool:
        if self._state in ("open", "params", "close"):
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
        if self._state == "open":
            return self._open(out)
        if self._state == "params":
            return self._params(out)
        if self._state == "value":
            end = self._fmt.value_end
            at = self._buf.find(end)
            if at < 0:
                return False
            out.append(Delta("args", self._args.add(self._param, self._buf[:at]), self.num_calls))
            self._buf, self._state = self._buf[at + len(end) :], "params"
            return True
        close = self._fmt.close
        if self._buf.startswith(close):  # close: after </function>
            self._buf, self._state, self._between = self._buf[len(close) :], "text", True
            return True
        if close.startswith(self._buf):
            return False
        self._state = "text"  # no </tool_call>: what follows is text again
        return True

    def _text(self, out: list[Delta]) -> bool:
        if self._between:  # the blank after a call (the grammar's `ws`) is no content
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._between = False
        text, start = self._until(self._starts)
        out.append(Delta("content", text))
        if start is None:
            return False
        if start != self._fmt.open:  # a bare <function=NAME> is the call: it stays to be read
            self._buf = start + self._buf
        self._state = "open"
        return True

    def _open(self, out: list[Delta]) -> bool:
        if not self._buf.startswith(FUNCTION):
            if FUNCTION.startswith(self._buf):
                return False
            out.append(Delta("content", self._fmt.open))  # not a call after all
            self._state = "text"
            return True
        end = self._buf.find(">")
        if end < 0:
            return False
        name = self._buf[len(FUNCTION) : end].strip()
        self._buf, self._state = self._buf[end + 1 :], "params"
        self._start_call(name, out)
        out.append(Delta("args", self._args.open(name), self.num_calls))
        return True

    def _params(self, out: list[Delta]) -> bool:
        if self._buf.startswith("</function>"):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._buf, self._state = self._buf[len("</function>") :], "close"
            return True
        if self._buf.startswith("<parameter="):
            end = self._buf.find(">")
            if end < 0:
                return False
            self._param = self._buf[len("<parameter=") : end].strip()
            rest, head = self._buf[end + 1 :], self._fmt.value_head
            if head and not rest:
                return False  # the newline after the tag is not the value's: wait for it
            self._buf = rest[len(head) :] if head and rest.startswith(head) else rest
            self._state = "value"
            return True
        if "</function>".startswith(self._buf) or "<parameter=".startswith(self._buf):
            return False
        self._buf = self._buf[1:]  # stray text inside a call (no grammar held it): skipped
        return True
