"""What every tool-call format offers the planner: a grammar for calls and a parser for
output, plus what the formats share (the grammar memo, text-exclusion rules).

A format family lives in its own module (chat/formats.py: the JSON families;
chat/formats_xml.py: Qwen3-Coder's XML; chat/harmony.py: gpt-oss's channels);
chat/formats.py's `detect_format` picks one from the template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chat.callstream import Delta
from chat.gbnf import RuleSet, literal
from chat.memo import ByteMemo
from chat.tools import Tool, ToolChoice


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


def tools_key(tools: Sequence[Tool]) -> str:
    return json.dumps([[t.name, t.parameters] for t in tools], sort_keys=True)


def document_key(document: Any, choice: ToolChoice) -> str:
    """The response schema as a memo key part; a document only matters in `auto` mode
    (with `required` or a named tool the answer is a call)."""
    if document is None or choice.mode != "auto":
        return ""
    return json.dumps(document, sort_keys=True)


def _spec_bytes(spec: GrammarSpec) -> int:
    return len(spec.gbnf) + sum(map(len, spec.trigger_patterns + spec.trigger_words))


# (format, mode, parallel, canonical tools JSON, document schema) -> grammar: agents
# resend the tools every turn. Bounded by bytes (see chat/memo.py).
GRAMMARS: ByteMemo[GrammarSpec] = ByteMemo(16 << 20, _spec_bytes)


def memo_grammar(key: str, make: Callable[[], GrammarSpec]) -> GrammarSpec:
    return GRAMMARS.get(key, make)


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
