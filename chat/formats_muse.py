"""Muse Glimmer's messages, each to a recipient, a call an ATEM block to the tool:

    <|start|>assistant to=self<|message|>plan<|eom|>
    <|start|>assistant to=user<|message|>Sure.<|eom|>
    <|start|>assistant to=get_time<|message|><atem:function_calls>
    <atem:invoke name="get_time">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eot|>

As llama.cpp reads them (common/parsers/muse-glimmer.cpp, test-chat.cpp's muse-glimmer
cases): the template that names `<atem:function_calls>` and `<|eom|>`. The generation
prompt is `<|start|>assistant`, so the output starts at the first message's recipient.
A message to `self` is reasoning, one to `user` (or to no one) content, up to `<|eom|>`
(more messages follow) or `<|eot|>` (the turn ends); a message to another recipient is
a call, its ATEM block read as a call only there (markup quoted in an answer or in the
reasoning stays text). A parameter whose schema admits a string is its text, any other
JSON. Parallel calls are messages in a row, each its own block.
"""

from __future__ import annotations

from collections.abc import Sequence

from chat.callformat import (
    GrammarSpec,
    OwnFormat,
    document_rule,
    excluding,
)
from chat.callstream import BufferedParser, Delta
from chat.gbnf import RuleSet, literal
from chat.tagged_args import Tags, TypedArgs, tagged_calls
from chat.tools import Tool

START, MESSAGE, EOM, EOT = "<|start|>assistant", "<|message|>", "<|eom|>", "<|eot|>"
TO = " to="
CALLS, CALLS_END = "<atem:function_calls>", "</atem:function_calls>"
INVOKE, INVOKE_END = '<atem:invoke name="', "</atem:invoke>"
PARAM, PARAM_END = '<atem:parameter name="', "</atem:parameter>"
# llama.cpp's trigger, as a whole-output match: a message to a recipient other than
# `self` and `user`, first in the output or after an assistant header
TRIGGER = (
    r"(?:[\s\S]*?<\|start\|>assistant)?"
    r"( to=(?!self<\|message\|>)(?!user<\|message\|>)[^<]*?<\|message\|>)[\s\S]*"
)


def detect_muse(source: str) -> OwnFormat | None:
    """llama.cpp's rule (common/chat.cpp)."""
    return MUSE_GLIMMER if CALLS in source and EOM in source else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    nl = rules.add("nl", "[ \\n]*")  # the template writes a newline after each tag

    def param(name: str, value: str) -> str:
        head = literal(PARAM + name + '">')
        return f"{head} {value} {literal(PARAM_END)} {nl}"

    tags = Tags(param, PARAM_END, "muse-text")
    tail = f"{literal(INVOKE_END)} {nl} {literal(CALLS_END)}"

    def parts(name: str, args: str) -> tuple[str, ...]:
        invoke = literal(INVOKE + name + '">')
        return f"{literal(TO + name + MESSAGE + CALLS)} {nl} {invoke}", nl, args, tail

    call = tagged_calls(rules, key, tags, parts)
    calls = f"{call} ({literal(EOM + START)} {call})*" if parallel else call
    if mode == "auto" and not doc_key:
        return GrammarSpec(rules.text(calls), lazy=True, trigger_patterns=(TRIGGER,))
    # Forced: messages to `self` may come first, then the calls (or, with a response
    # schema in auto mode, the document as the answer to the user).
    thought = excluding(rules, "thought", EOM)
    analysis = rules.add("analysis", f"{literal(TO + 'self' + MESSAGE)} {thought} "
                                     f"{literal(EOM + START)}")  # fmt: skip
    answer = calls
    if doc_key:
        document = document_rule(rules, doc_key)
        answer = f"({calls} | ({literal(TO + 'user')})? {literal(MESSAGE)} {document})"
    return GrammarSpec(rules.text(f"{analysis}* {answer}"))


class MuseParser(BufferedParser):
    """Messages -> reasoning / content / calls, incrementally; text that may still be a
    header or a tag is held back until it resolves. A call's arguments stream as each
    closes."""

    def __init__(self, tools: Sequence[Tool], reasoning: bool):
        super().__init__()
        self._reasoning = reasoning
        self._calls = bool(tools)
        self._args = TypedArgs(tools, text_if_string=True)
        self._state = "head"
        self._key = ""
        self._value = ""  # the open parameter's text so far

    def _step(self, out: list[Delta]) -> bool:
        state = self._state
        if state == "head":
            return self._head(out)
        if state in ("self", "user"):
            text, word = self._until((EOM, EOT))
            kind = "reasoning" if state == "self" and self._reasoning else "content"
            out.append(Delta(kind, text))  # type: ignore[arg-type]
            if word is None:
                return False
            self._state = "end"
        elif state == "end":  # the next message's header, or stray text (content)
            if self._may_become(START):
                return False
            self._state = "head" if self._take(START) else "user"
        elif state == "value":
            text, word = self._until((PARAM_END,))
            self._value += text
            if word is None:
                return False
            out.append(Delta("args", self._args.add(self._key, self._value), self.num_calls))
            self._state = "params"
        else:
            return self._block(out)
        return True

    def _head(self, out: list[Delta]) -> bool:
        """A message's recipient: ` to=NAME<|message|>`, or `<|message|>` for the user."""
        if self._may_become(TO) or self._may_become(MESSAGE):
            return False
        if self._take(MESSAGE):
            self._state = "user"
            return True
        if not self._buf.startswith(TO):
            self._state = "user"  # no header: text for the user
            return True
        at = self._buf.find(MESSAGE)
        if at < 0:  # wait for it, unless the recipient holds what no header does
            rest = self._buf[len(TO) :]
            lt = rest.find("<")
            return lt >= 0 and not MESSAGE.startswith(rest[lt:]) and self._not_a_header()
        recipient = self._buf[len(TO) : at]
        if recipient in ("self", "user") or self._calls:
            self._buf = self._buf[at + len(MESSAGE) :]
            self._state = recipient if recipient in ("self", "user") else "block"
            return True
        return self._not_a_header()

    def _not_a_header(self) -> bool:
        self._state = "user"  # its text stays as written (no tool is offered to call)
        return True

    def _block(self, out: list[Delta]) -> bool:
        """The ATEM block of a message to a tool: its invoke, parameters and closes."""
        self._buf = self._buf.lstrip()
        state = self._state
        words = {"block": (CALLS, INVOKE), "params": (PARAM, INVOKE_END), "tail": (CALLS_END,)}
        if any(self._may_become(w) for w in words[state]):
            return False
        if state == "block" and self._take(CALLS):
            return True
        if state == "block" and self._buf.startswith(INVOKE):
            end = self._buf.find('">', len(INVOKE))
            if end < 0:
                return False
            name, self._buf = self._buf[len(INVOKE) : end], self._buf[end + 2 :]
            self._start_call(name, out)
            out.append(Delta("args", self._args.open(name), self.num_calls))
            self._state = "params"
        elif state == "params" and self._buf.startswith(PARAM):
            end = self._buf.find('">', len(PARAM))
            if end < 0:
                return False
            self._key, self._buf = self._buf[len(PARAM) : end], self._buf[end + 2 :]
            self._value, self._state = "", "value"
        elif state == "params" and self._take(INVOKE_END):
            out.append(Delta("args", "}", self.num_calls))
            self.num_calls += 1
            self._state = "tail"
        elif state == "tail" and self._take(CALLS_END):
            self._state = "user"  # up to the message's end (nothing, when a grammar held it)
        elif state == "block":
            self._state = "user"  # not an ATEM block: its text is content
        elif self._take(EOM) or self._take(EOT):
            self._state = "end"  # the message ended inside the block (no grammar held it)
        elif self._buf:
            self._buf = self._buf[1:]  # stray text in the block (no grammar held it)
        return True

    def finish(self) -> list[Delta]:
        """A call cut off was reported as started: it counts as truncated."""
        out: list[Delta] = []
        if self._state == "self" and self._reasoning and self._buf:
            out.append(Delta("reasoning", self._buf))
        elif self._state in ("head", "self", "user", "end") and self._buf:
            out.append(Delta("content", self._buf))
        self._buf = ""
        return out


MUSE_GLIMMER = OwnFormat(
    "muse-glimmer", _grammar, MuseParser
)  # its thinking: the messages to `self`
