"""Large bounds in JSON schemas and regexes: past the grammar's limit they become
unbounded repetitions (never a refusal of a valid schema), and the grammar still
constrains the value's shape. Grammars are checked against instances by llama.cpp's own
grammar engine (tests/chat/gbnf_check.py, vocabulary only) and the tests' GBNF
recognizer, and against the engine's safety check."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from chat.gbnf import MAX_BOUND, MAX_TOTAL, RuleSet, bounds
from chat.gbnf_read import GbnfError, parse_gbnf
from chat.regex import PatternError, regex_to_gbnf
from chat.schema import schema_to_gbnf
from engine.grammar import check_gbnf
from tests.chat import gbnf_check
from tests.chat.test_schema import SCHEMAS
from tests.helpers import gbnf_match


def accepts(grammar: str, text: str) -> bool:
    """Both recognizers agree (llama.cpp's is the reference; ours is what the server
    tests use)."""
    verdict = gbnf_check.accepts(grammar, text)
    assert gbnf_match.accepts(grammar, text) == verdict, (grammar, text)
    return verdict


def dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# Claude Code's shape (a string of maxLength 524288), a huge array, a huge minimum.
HUGE = [
    ({"type": "object", "properties": {"content": {"type": "string", "maxLength": 524288}},
      "required": ["content"]}, {"content": "hello"}, {"content": 5}),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1000000}, [1, 2, 3], ["a"]),
    ({"type": "string", "minLength": 10**9}, "x", 7),
    ({"type": "array", "items": {"type": "string"}, "minItems": 5000, "maxItems": 10**7},
     ["a", "b"], [1, 2]),
    ({"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "null"},
      "maxItems": 99999}, [True, None, None], [None]),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "good", "bad"), HUGE, ids=range(len(HUGE)))
def test_huge_bounds_convert_and_still_constrain(schema: Any, good: Any, bad: Any) -> None:
    grammar = schema_to_gbnf(schema)
    check_gbnf(grammar)  # the engine's check: what answered 400 before
    assert all(int(n) <= MAX_BOUND for n in re.findall(r"\{(\d+)", grammar))
    assert accepts(grammar, dump(good))
    assert not accepts(grammar, dump(bad))


def test_small_bounds_are_still_enforced() -> None:
    grammar = schema_to_gbnf({"type": "string", "minLength": 2, "maxLength": 3})
    assert [accepts(grammar, dump("x" * n)) for n in range(5)] == [False, False, True, True, False]
    grammar = schema_to_gbnf({"type": "array", "minItems": 1, "maxItems": 2})
    assert [accepts(grammar, dump([0] * n)) for n in range(4)] == [False, True, True, False]


def test_bounds_is_the_one_rule() -> None:
    assert bounds(3, 7) == (3, 7)
    assert bounds(0, MAX_BOUND + 1) == (0, None)
    assert bounds(MAX_BOUND + 1, None) == (1, None)
    assert bounds(0, None) == (0, None)
    assert bounds(2, 10, spent=MAX_TOTAL - 5) == (2, None)  # the grammar's budget is spent


def test_many_bounds_in_one_grammar_stay_within_the_engine_limit() -> None:
    """A catalogue of tools each with a large bound: the grammar's total stays under the
    engine's limit (engine/grammar.py), later bounds going unbounded."""
    props = {f"p{i}": {"type": "string", "maxLength": 900 + i} for i in range(200)}
    grammar = schema_to_gbnf({"type": "object", "properties": props})
    check_gbnf(grammar)
    total = sum(max(map(int, filter(None, m))) for m in re.findall(r"\{(\d+),?(\d*)\}", grammar))
    assert 0 < total <= MAX_TOTAL + 100  # (+ the primitives' own small bounds)
    rules = RuleSet()
    rules.repeat("a", "x", 0, MAX_TOTAL)
    assert rules.spent == 0  # past MAX_BOUND: written unbounded, nothing spent


def test_nested_pattern_repetitions_become_rules() -> None:
    """llama.cpp multiplies a group's repetition by the rules inside it and refuses past
    2000; a compound repeated item is a rule of its own instead."""
    grammar = schema_to_gbnf({"type": "string", "pattern": "^((ab){1,900}c){1,900}$"})
    assert not re.search(r"\)\{", grammar)  # no repeated group
    assert accepts(grammar, dump("ababcabc")) and not accepts(grammar, dump("abab"))


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_every_schema_grammar_reads_as_gbnf(schema: Any) -> None:
    parse_gbnf(schema_to_gbnf(schema))


@pytest.mark.parametrize(
    ("regex", "good", "bad"),
    [
        ("^[A-Z]{3}-\\d{2}$", ["ABC-12"], ["abc-12", "ABC-123", "xABC-12"]),
        ("(yes|no)", ["yes", "no"], ["yes!", "maybe"]),
        ("a.c", ["abc", 'a"c'], ["a\nc", "ac"]),
        ("\\s*\\w+\\s*", [" x_1\n"], ["-"]),
        ('[^"]{0,5000}', ["", "x" * 40, "\\"], ['"']),
        ("ab{0}c|x+?", ["ac", "xx"], ["abc", ""]),  # {0}: nothing; lazy: the same whole matches
    ],
)
def test_whole_output_regex(regex: str, good: list[str], bad: list[str]) -> None:
    grammar = regex_to_gbnf(regex)
    check_gbnf(grammar)
    for text in good:
        assert accepts(grammar, text), text
    for text in bad:
        assert not accepts(grammar, text), text


def test_unsupported_regex_raises() -> None:
    with pytest.raises(PatternError):
        regex_to_gbnf("(?=x)x")


@pytest.mark.parametrize(
    "text",
    ["start: WORD+\nWORD: /[a-z]+/", "root = 'a' | 'b' ;", 'value ::= "a"\n', 'root ::= a\n',
     'root ::= "a\n', 'root ::= [a-z\n', 'root ::= "a" )\n', 'root ::= "\\q"\n'],
)  # fmt: skip
def test_unreadable_gbnf_is_refused(text: str) -> None:
    with pytest.raises(GbnfError):
        parse_gbnf(text)


def test_gbnf_reader_takes_llama_cpp_syntax() -> None:
    text = (
        "# a comment\n"
        'root ::= (item ws)+ "." # trailing\n'
        'item ::= [a-z]{1,3} | "\\x41" | . "!"\n'
        "ws ::= [ \\t]*\n"
        "tok ::= <[5]> !<[12]>\n"
    )
    parse_gbnf(text)
    assert accepts(text, "ab A ?!.") and not accepts(text, "ab -.")
