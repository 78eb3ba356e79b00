"""Kimi K3's sections, tags made of `<|open|>`, `<|close|>` and `<|sep|>` (its XTML):

    <|open|>think<|sep|>plan<|close|>think<|sep|>
    <|open|>response<|sep|>Sure.<|close|>response<|sep|>
    <|open|>tools<|sep|><|open|>call tool="get_time" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>

(the sections written on one line, without the breaks drawn here)

As llama.cpp reads them (common/parsers/kimi-k3.cpp, test-chat.cpp's Kimi-K3 cases):
the template that names `<|open|>`, `<|close|>` and `<|end_of_msg|>`. The generation
prompt opens the think section (the response section with `thinking` off), so the
output starts inside it: the format is bound to the prompt (`for_prompt`) and its
parser starts in the section the prompt opened. Thinking ends at its close or at the
response's opening; the response's text is the content, up to its close, the tools
section or the message's close; the calls follow in one tools section. An argument
whose schema admits a string is its text, any other JSON (llama.cpp: by the schema's
`type`, a missing one read as a string); the `type` and `index` attributes are written
as the template writes them. The message's close and `<|end_of_msg|>` are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    excluding,
    keyed_tools,
    lazy_at,
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tagged_args import Tags, TypedArgs, tagged_arguments
from chat.tools import Tool

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
THINK, THINK_END = OPEN + "think" + SEP, CLOSE + "think" + SEP
RESPONSE, RESPONSE_END = OPEN + "response" + SEP, CLOSE + "response" + SEP
TOOLS, TOOLS_END = OPEN + "tools" + SEP, CLOSE + "tools" + SEP
CALL, CALL_END = OPEN + 'call tool="', CLOSE + "call" + SEP
ARG, ARG_END = OPEN + 'argument key="', CLOSE + "argument" + SEP
MESSAGE_END = CLOSE + "message" + SEP
QUOTE_SEP = '"' + SEP  # an attribute's closing quote and the tag's end
# the template's `type` attribute of a value (its xtml_type), by the schema's type
_XTML_TYPES = {
    "string": "string", "integer": "number", "number": "number", "boolean": "boolean",
    "null": "null", "object": "object", "array": "array",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class KimiK3Format(MemoizedGrammar):
    name: str = "kimi-k3"
    opened: str = ""  # the section the prompt opened: "think", "response" or none
    native: bool = True
    owns_reasoning: bool = True

    def for_prompt(self, prompt: str) -> KimiK3Format:
        end = prompt.rstrip()
        opened = "think" if end.endswith(THINK) else "response" if end.endswith(RESPONSE) else ""
        return replace(self, opened=opened)

    def bound_to(self) -> str:
        return self.opened

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self.opened, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return KimiK3Parser(tools, reasoning, self.opened)


KIMI_K3 = KimiK3Format()


def detect_kimi3(source: str) -> KimiK3Format | None:
    """llama.cpp's rule (common/chat.cpp)."""
    return KIMI_K3 if all(w in source for w in (OPEN, CLOSE, EOM)) else None


def _grammar(opened: str, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    types: dict[str, Any] = {}  # the properties of the tool being written

    def param(name: str, value: str) -> str:
        kind = types.get(name, {}).get("type") if isinstance(types.get(name), dict) else None
        xtml = _XTML_TYPES.get(kind) if isinstance(kind, str) else None
        names = [xtml] if xtml else sorted(set(_XTML_TYPES.values()))
        attr = rules.add(f"type-{'-'.join(names)}", " | ".join(literal(n) for n in names))
        head = literal(ARG + name + '" type="')
        return f"{head} ({attr}) {literal(QUOTE_SEP)} {value} {literal(ARG_END)}"

    tags = Tags(param, ARG_END, "k3-text")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        props = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
        types.clear()
        types.update(props if isinstance(props, dict) else {})
        args = tagged_arguments(rules, i, tool, tags)
        name = literal(CALL + tool.name + '" index="')
        head = f"{name} [0-9]+ {literal(QUOTE_SEP)}"
        body = " ".join(p for p in (head, args, literal(CALL_END)) if p)
        alternatives.append(rules.add(f"call-{i}", body))
    call = rules.add("call", " | ".join(alternatives))
    calls = f"{call}+" if parallel else call
    section = rules.add("tools", f"{literal(TOOLS)} {calls} {literal(TOOLS_END)} "
                                 f"({literal(MESSAGE_END)})?")  # fmt: skip
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(section), TOOLS)
    # Forced: the thinking the prompt opened closes first (a call inside it would be
    # reasoning), a response may come before the calls, as llama.cpp's grammar allows.
    think = f"{excluding(rules, 'think', THINK_END)} {literal(THINK_END)}"
    lead = {"think": think, "response": ""}.get(opened, f"({literal(THINK)} {think})?")
    text = f"{excluding(rules, 'response', RESPONSE_END)} {literal(RESPONSE_END)}"
    response = f"({text})?" if opened == "response" else f"({literal(RESPONSE)} {text})?"
    answer = section
    if doc_key:  # calls, or the document as the response
        open_doc = "" if opened == "response" else literal(RESPONSE)
        document = f"{open_doc} {document_rule(rules, doc_key)} {literal(RESPONSE_END)}"
        answer = f"({section} | {document})"
        response = "" if opened == "response" else response
    return GrammarSpec(rules.text(" ".join(p for p in (lead, response, answer) if p)))


class KimiK3Parser(BufferedParser):
    """Sections -> reasoning / content / calls, incrementally; text that may still be a
    tag is held back until it resolves. A call's arguments stream as each closes."""

    def __init__(self, tools: Sequence[Tool], reasoning: bool, opened: str):
        super().__init__()
        self._reasoning = reasoning
        self._calls = bool(tools)
        self._args = TypedArgs(tools, text_if_string=True)
        self._state = {"think": "think", "response": "response"}.get(opened, "lead")
        self._key = ""
        self._value = ""  # the open argument's text so far

    def _step(self, out: list[Delta]) -> bool:
        state = self._state
        if state == "lead":  # a section opens, or the text is the response's
            if self._may_become(THINK) or self._may_become(RESPONSE):
                return False
            self._state = "think" if self._take(THINK) else "response"
            self._take(RESPONSE)
        elif state == "think":  # ends at its close, or at the response's opening
            text, word = self._until((THINK_END, RESPONSE))
            out.append(Delta("reasoning" if self._reasoning else "content", text))
            if word is None:
                return False
            self._state = "lead" if word == THINK_END else "response"
        elif state == "response":
            ends = (RESPONSE_END, MESSAGE_END, EOM) + ((TOOLS,) if self._calls else ())
            text, word = self._until(ends)
            out.append(Delta("content", text))
            if word is None:
                return False
            self._state = "tools" if word == TOOLS else "after"
        elif state == "after":  # the tools section, the message's end, or more text
            for word, nxt in ((TOOLS, "tools"), (MESSAGE_END, "after"), (EOM, "after")):
                if self._may_become(word):
                    return False
                if (word != TOOLS or self._calls) and self._take(word):
                    self._state = nxt
                    return True
            self._state = "response"
        elif state == "value":
            text, word = self._until((ARG_END,))
            self._value += text
            if word is None:
                return False
            out.append(Delta("args", self._args.add(self._key, self._value), self.num_calls))
            self._state = "call"
        else:
            return self._tags(out)
        return True

    def _tags(self, out: list[Delta]) -> bool:
        """Inside the tools section (a call opens, the section closes) or a call (an
        argument opens, the call closes); a tag's attributes end at `<|sep|>`."""
        opener, end = (CALL, TOOLS_END) if self._state == "tools" else (ARG, CALL_END)
        if self._may_become(opener) or self._may_become(end):
            return False
        if self._take(end):
            if self._state == "call":
                out.append(Delta("args", "}", self.num_calls))
                self.num_calls += 1
            self._state = "tools" if self._state == "call" else "after"
        elif self._buf.startswith(opener):
            name_end, sep = self._buf.find('"', len(opener)), self._buf.find(SEP, len(opener))
            if name_end < 0 or sep < 0:
                return False
            name, self._buf = self._buf[len(opener) : name_end], self._buf[sep + len(SEP) :]
            if self._state == "tools":
                self._start_call(name, out)
                out.append(Delta("args", self._args.open(name), self.num_calls))
                self._state = "call"
            else:
                self._key, self._value, self._state = name, "", "value"
        else:
            self._buf = self._buf[1:]  # stray text in the section (no grammar held it)
        return True

    def finish(self) -> list[Delta]:
        """A call cut off is reported as started: it counts as truncated."""
        out: list[Delta] = []
        if self._state == "think" and self._buf:
            out.append(Delta("reasoning" if self._reasoning else "content", self._buf))
        elif self._state in ("lead", "response", "after") and self._buf:
            out.append(Delta("content", self._buf))
        elif self._state == "tools" and self._buf.startswith(CALL):  # cut off in its tag
            name = self._buf[len(CALL) :].partition('"')[0]
            if name:
                self._start_call(name, out)
        self._buf = ""
        return out
