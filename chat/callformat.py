"""What every tool-call format offers the planner: a grammar for calls and a parser for
output, plus what the formats share (the memoized grammar, lazy triggers, thinking
before a forced answer, text-exclusion rules).

A format family lives in its own module (chat/formats.py: the JSON families;
chat/formats_xml.py: Qwen3-Coder's XML; chat/formats_glm.py: GLM's tags;
chat/formats_sections.py: DeepSeek's and Kimi's sections; chat/formats_cohere.py:
Command R7B's blocks; chat/harmony.py: gpt-oss's channels); chat/formats.py's
`detect_format` picks one from the template. Their parsers share chat/callstream.py's
`BufferedParser`.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from chat.callstream import Delta
from chat.gbnf import RuleSet, literal
from chat.lark import tool_input_gbnf
from chat.memo import ByteMemo
from chat.schema import SchemaConverter, SchemaError
from chat.textgrammar import TextGrammarError
from chat.tools import INPUT, ChatInputError, InputGrammar, Tool, ToolChoice


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A grammar for the engine. Lazy: free until a trigger pattern (a regex matched
    against the whole output so far; its first group marks where the grammar starts)
    or a trigger word that the server finds to be a single special token."""

    gbnf: str
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()
    trigger_words: tuple[str, ...] = ()


class CallParser(Protocol):
    """Output text -> content / reasoning / call deltas, incrementally. `num_calls`
    counts the calls complete so far (a later call's deltas are held until it is)."""

    num_calls: int

    def feed(self, text: str) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class CallFormat(Protocol):
    """A model family's call syntax.

    `native`: the template renders `tools` and `tool_calls` itself. `owns_reasoning`:
    the format's parser splits thinking from the answer (gpt-oss's channels), so the
    `<think>` splitter stays out and the parser runs even when no tool is offered."""

    @property
    def name(self) -> str: ...

    @property
    def native(self) -> bool: ...

    @property
    def owns_reasoning(self) -> bool: ...

    def grammar(
        self, tools: list[Tool], choice: ToolChoice, parallel: bool, document: Any = None
    ) -> GrammarSpec: ...

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser: ...


@runtime_checkable
class TurnAdapter(Protocol):
    """A format whose template needs the conversation or the prompt adjusted, as
    llama.cpp's handler for it does (Gemma 4: chat/formats_gemma.py)."""

    def adapt_messages(
        self, source: str, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]: ...

    def adapt_prompt(self, text: str, generation: bool) -> str: ...


@runtime_checkable
class PromptBound(Protocol):
    """A format whose grammar depends on the prompt the answer follows, as llama.cpp's
    handler for it builds it per request (DeepSeek V3.1: whether the prompt closed the
    thinking; Kimi K2: the index of the next call; chat/formats_sections.py)."""

    def for_prompt(self, prompt: str) -> CallFormat: ...


class MemoizedGrammar(ABC):
    """A format's `grammar`, built by its `build` from what the grammar depends on and
    memoized by it (bounded by bytes): agents resend the same tools every turn."""

    __slots__ = ()
    name: str

    def grammar(
        self, tools: list[Tool], choice: ToolChoice, parallel: bool, document: Any = None
    ) -> GrammarSpec:
        """The calls grammar; with `document` (a JSON schema), in `auto` mode the answer is
        either calls or one document matching it (tools together with a response format)."""
        key, doc = tools_key(tools), document_key(document, choice)
        return memo_grammar(
            f"{self.name}|{self.bound_to()}|{choice.mode}|{parallel}|{key}|{doc}",
            lambda: self.build(key, choice.mode, parallel, doc),
        )

    def bound_to(self) -> str:
        """What a `PromptBound` format took from the prompt (`for_prompt`) that its grammar
        depends on, as a memo key part ("" for none)."""
        return ""

    @abstractmethod
    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        """The grammar for the tools `key` holds (`keyed_tools`), the tool choice's mode
        and the response schema `doc_key` holds ("" for none)."""


@dataclass(frozen=True, slots=True)
class OwnFormat(MemoizedGrammar):
    """A format with a syntax of its own (the template renders `tools` and `tool_calls`
    itself) whose parser splits the thinking itself (unless `owns_reasoning` is off: the
    plan's `<think>` split has it): its grammar built by `build_grammar`
    (`MemoizedGrammar.build`'s arguments), its parser made by `new_parser` from the
    tools offered and whether to split the thinking."""

    name: str
    build_grammar: Callable[[str, str, bool, str], GrammarSpec]
    new_parser: Callable[[Sequence[Tool], bool], CallParser]
    native: bool = True
    owns_reasoning: bool = True

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return self.build_grammar(key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return self.new_parser(tools, reasoning)


def tools_key(tools: Sequence[Tool]) -> str:
    """What a call grammar depends on, as a memo key part: `[name, parameters, grammar]`
    per tool (grammar: `[syntax, definition]` or null). Builders read it back with
    `keyed_tools`, so that a grammar depends on nothing the key leaves out."""
    return json.dumps(
        [[t.name, t.parameters, [t.grammar.syntax, t.grammar.definition] if t.grammar else None]
         for t in tools],
        sort_keys=True,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class KeyedTool:
    """One tool as `tools_key` holds it."""

    name: str
    parameters: Any
    grammar: InputGrammar | None


def keyed_tools(key: str) -> list[KeyedTool]:
    return [KeyedTool(name, parameters, InputGrammar(*grammar) if grammar else None)
            for name, parameters, grammar in json.loads(key)]  # fmt: skip


def json_arguments(rules: RuleSet, i: int, tool: KeyedTool) -> str:
    """A rule for the JSON object of tool `i`'s arguments: its parameters' schema, or for
    a tool with an input grammar `{"input": "<the JSON text of a sentence>"}`."""
    if tool.grammar is not None:
        ws = rules.primitive("ws")
        text = input_grammar(rules, i, tool.grammar, json_text=True)
        return rules.add(f"t{i}-args", f'"{{" {ws} {literal(json.dumps(INPUT))} {ws} ":" {ws} '
                                       f'"\\"" {text} "\\"" {ws} "}}"')  # fmt: skip
    if tool.parameters in ({}, True):
        return rules.primitive("object")
    try:
        return SchemaConverter(rules, tool.parameters, f"t{i}-").convert(tool.parameters, "args")
    except SchemaError as exc:
        raise ChatInputError(str(exc), param=f"tools[{i}].function.parameters") from None


def input_grammar(rules: RuleSet, i: int, grammar: InputGrammar, json_text: bool) -> str:
    """Tool `i`'s input grammar as a GBNF expression: the JSON text of the string
    (`json_text`) or the text itself. The server converts it once when it reads the request
    (a 400 naming the format there); this error is for a caller that did not."""
    try:
        return tool_input_gbnf(grammar.syntax, grammar.definition, rules, f"t{i}-in-", json_text)
    except TextGrammarError as exc:
        raise ChatInputError(str(exc), param=f"tools[{i}].format.definition") from None


def document_key(document: Any, choice: ToolChoice) -> str:
    """The response schema as a memo key part; a document only matters in `auto` mode
    (with `required` or a named tool the answer is a call)."""
    if document is None or choice.mode != "auto":
        return ""
    return json.dumps(document, sort_keys=True)


def document_rule(rules: RuleSet, doc_key: str) -> str:
    """A rule for one document matching the response schema `document_key` holds."""
    document = json.loads(doc_key)
    try:
        return SchemaConverter(rules, document, "doc-").convert(document, "document")
    except SchemaError as exc:
        raise ChatInputError(str(exc), param="response_format.json_schema.schema") from None


def _spec_bytes(spec: GrammarSpec) -> int:
    return len(spec.gbnf) + sum(map(len, spec.trigger_patterns + spec.trigger_words))


# (format, mode, parallel, canonical tools JSON, document schema) -> grammar: agents
# resend the tools every turn. Bounded by bytes (see chat/memo.py).
GRAMMARS: ByteMemo[GrammarSpec] = ByteMemo(16 << 20, _spec_bytes)


def memo_grammar(key: str, make: Callable[[], GrammarSpec]) -> GrammarSpec:
    return GRAMMARS.get(key, make)


def starts_at(word: str) -> str:
    """A lazy trigger pattern (matched against the whole output so far, std::regex
    ECMAScript) for `word` anywhere: the grammar starts at it."""
    return rf"[\s\S]*?({re.escape(word)})[\s\S]*"


def lazy_at(gbnf: str, word: str) -> GrammarSpec:
    """A lazy grammar that starts at `word`, a special token, anywhere in the output."""
    return GrammarSpec(gbnf, lazy=True, trigger_patterns=(starts_at(word),), trigger_words=(word,))


def thinking_block(rules: RuleSet, close: str, opening: str = "", closing: str = "") -> str:
    """A rule for a thinking block ended by `close`: GBNF `opening`, text that cannot hold
    `close`, `close`, GBNF `closing`."""
    thinking = excluding(rules, "thinking", close)
    return rules.add("think", f"{opening} {thinking} {literal(close)} {closing}".strip())


def thinking_then(
    rules: RuleSet, think: str, answer: str, doc_key: str, answer_doc: Callable[[str], str] = str
) -> GrammarSpec:
    """A forced answer's grammar (`required` / named mode, or `auto` with a response
    schema): the thinking may come first, so that a forced call does not land inside the
    reasoning; then `answer`, or with a response schema, its document (written as the
    format writes an answer: `answer_doc` of the document's rule)."""
    if doc_key:
        answer = f"({answer} | {answer_doc(document_rule(rules, doc_key))})"
    return GrammarSpec(rules.text(f"({think})? {answer}"))


def lazy_or_forced(
    rules: RuleSet, calls: str, mode: str, doc_key: str, trigger: str, think_close: str,
    think_open: str = "", *, bare_close: bool = False, answer_doc: Callable[[str], str] = str,
    think_tail: str = "",
) -> GrammarSpec:  # fmt: skip
    """An own-syntax format's grammar for `calls` (a GBNF expression): in `auto` mode
    without a response schema lazy at `trigger`, the calls' own opening; forced, the
    thinking (GBNF `think_open`, text, `think_close`, GBNF `think_tail`; with
    `bare_close` the close alone may stand for a turn without thinking) may come first
    (`thinking_then`)."""
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(calls), trigger)
    think = thinking_block(rules, think_close, think_open, think_tail)
    if bare_close:
        think = rules.add("think-or-not", f"{think} | {literal(think_close)}")
    return thinking_then(rules, think, calls, doc_key, answer_doc)


def excluding(rules: RuleSet, base: str, word: str) -> str:
    """A rule matching any text that does not contain `word` (llama.cpp's `until`):
    one rule per state of the automaton that tracks how much of `word` the text ends
    with, so the word can never complete. Every state accepts (the text may end)."""
    states = [rules.reserve(f"{base}-{i}") for i in range(len(word))]
    chars = sorted(set(word))
    others = "".join(_class_char(c) for c in chars)
    for state, name in enumerate(states):
        body = ""  # the empty alternative first, as llama.cpp writes it: "| a s1 | ..."
        for ch in chars:
            nxt = _advance(word, state, ch)
            if nxt < len(word):  # a character that would complete the word has no branch
                body += f" | [{_class_char(ch)}] {states[nxt]}"
        rules.define(name, f"{body} | [^{others}] {states[0]}".lstrip())
    return states[0]


def _advance(word: str, state: int, ch: str) -> int:
    """How much of `word` the text ends with after `ch`, having ended with `state` of it."""
    text = word[:state] + ch
    for k in range(min(len(word), len(text)), 0, -1):
        if text.endswith(word[:k]):
            return k
    return 0


def _class_char(ch: str) -> str:
    if ch in "]\\^-":
        return "\\" + ch
    return literal(ch)[1:-1]
