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
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
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

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return XmlCallParser(self, tools)


QWEN3_CODER = XmlFormat("qwen3-coder", bare_first=True)
QWEN3_XML = XmlFormat("qwen3-xml", bare_first=False)  # the thinking templates


def detect_xml(source: str) -> XmlFormat | None:
    """llama.cpp's rule (common/chat.cpp): `<tool_call>`, `<function=` and `<parameter=`
    in the template, except templates that write `<tool_call><function=` without the
    newlines between them."""
    if not all(tag in source for tag in (OPEN, FUNCTION, "<parameter=")):
        return None
    if "'<tool_call><function=' ~ tool_call.name ~ '>'" in source:
        return None
    return QWEN3_XML if "<think>" in source else QWEN3_CODER


def _grammar(fmt: XmlFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    close = literal(VALUE_END)
    names = []
    alternatives = []

    def param(name: str, value: str) -> str:
        opener = literal(f"<parameter={name}>\n")
        return f"{opener} {value} {close}"

    tags = Tags(param, VALUE_END, "xml-arg-text")
    for i, tool in enumerate(keyed_tools(key)):
        names.append(tool.name)
        args = tagged_arguments(rules, i, tool, tags)
        head, tail = literal(f"{FUNCTION}{tool.name}>\n"), literal("</function>\n")
        alternatives.append(rules.add(f"call-{i}", " ".join(p for p in (head, args, tail) if p)))
    opener = literal(OPEN + "\n")
    body = rules.add("call-body", f"({' | '.join(alternatives)}) {literal(CLOSE)} {ws}")
    call = rules.add("call", f"{opener} {body}")
    first = rules.add("call-first", f"({opener})? {body}") if fmt.bare_first else call
    root = f"{first} {call}*" if parallel else first
    lazy = mode == "auto"
    if doc_key:  # calls | the document: no longer free text, so not lazy
        value = document_rule(rules, doc_key)
        root, lazy = f"({root}) | {value}", False
    starts = [OPEN] + ([f"{FUNCTION}{n}>" for n in names] if fmt.bare_first else [])
    patterns = tuple(starts_at(s) for s in starts)
    return GrammarSpec(rules.text(root), lazy=lazy, trigger_patterns=patterns if lazy else ())


class XmlCallParser(BufferedParser):
    """Splits output into content and XML calls, incrementally. Text that may still
    open a call is held back; each parameter's value is typed once it closes."""

    def __init__(self, fmt: XmlFormat, tools: Sequence[Tool]):
        super().__init__()
        self._args = TypedArgs(tools)
        self._starts = [OPEN] + ([f"{FUNCTION}{t.name}>" for t in tools] if fmt.bare_first else [])
        self._state = "text"  # text | open | params | value | close
        self._param = ""
        self._between = False

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state == "text" and self._buf:
            out.append(Delta("content", self._buf))
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "text":
            return self._scan_text(out)
        if self._state in ("open", "params", "close"):
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
        if self._state == "open":
            return self._open(out)
        if self._state == "params":
            return self._params(out)
        if self._state == "value":
            at = self._buf.find(VALUE_END)
            if at < 0:
                return False
            out.append(Delta("args", self._args.add(self._param, self._buf[:at]), self.num_calls))
            self._buf, self._state = self._buf[at + len(VALUE_END) :], "params"
            return True
        if self._buf.startswith(CLOSE):  # close: after </function>
            self._buf, self._state, self._between = self._buf[len(CLOSE) :], "text", True
            return True
        if CLOSE.startswith(self._buf):
            return False
        self._state = "text"  # no </tool_call>: what follows is text again
        return True

    def _scan_text(self, out: list[Delta]) -> bool:
        if self._between:  # the blank after a call (the grammar's `ws`) is no content
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._between = False
        text, start = self._until(self._starts)
        out.append(Delta("content", text))
        if start is None:
            return False
        if start != OPEN:  # a bare <function=NAME> is the call: it stays to be read
            self._buf = start + self._buf
        self._state = "open"
        return True

    def _open(self, out: list[Delta]) -> bool:
        if not self._buf.startswith(FUNCTION):
            if FUNCTION.startswith(self._buf):
                return False
            out.append(Delta("content", OPEN))  # not a call after all
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
            rest = self._buf[end + 1 :]
            if not rest:
                return False  # the newline after the tag is not the value's: wait for it
            self._buf, self._state = rest[1:] if rest.startswith("\n") else rest, "value"
            return True
        if "</function>".startswith(self._buf) or "<parameter=".startswith(self._buf):
            return False
        self._buf = self._buf[1:]  # stray text inside a call (no grammar held it): skipped
        return True
