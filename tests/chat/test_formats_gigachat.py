"""GigaChat 3's `function call` message and GigaChat 3.1's `<|function_call|>`, each one
JSON call a turn, against the cases of llama.cpp's tests/test-chat.cpp (the GigaChat V3
and V3.1 blocks): the plan's parser fed whole and in pieces, the grammars checked by
llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls rendered through
the templates. Not ported: the continuation cases (an assistant prefill continues as
plain text here)."""

from __future__ import annotations

import pytest

from chat.callformat import CallFormat
from chat.formats import GIGACHAT3, GIGACHAT3_1
from chat.reasoning import thinking_syntax
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    TEMPLATES,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    truncated,
)

V3, V31 = "GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja"
CALL_JSON = '{"name": "special_function", "arguments": {"arg1": 1}}'
V3_CALL = "<|message_sep|>\n\nfunction call<|role_sep|>\n" + CALL_JSON
V31_CALL = "<|function_call|>" + CALL_JSON
TWO = [T.special_function_tool, T.python_tool]

# (the test-chat.cpp case, template, tools, output, reasoning, content, calls)
CASES = cases(None, [
    ("V3 content", V3, [], HELLO, "", HELLO, []),
    ("V3 a call", V3, [T.special_function_tool], V3_CALL, "", "", SPECIAL),
    ("V3 content and a call", V3, [T.special_function_tool], HELLO + V3_CALL, "", HELLO, SPECIAL),
    ("V3.1 content", V31, [], HELLO, "", HELLO, []),
    ("V3.1 a call", V31, [T.special_function_tool], V31_CALL, "", "", SPECIAL),
    ("V3.1 content and a call", V31, [T.special_function_tool], HELLO + V31_CALL, "", HELLO,
     SPECIAL),
    # kvserve's own: no tools offered, the marker is content; the message end after a call
    ("V3 no tools offered", V3, [], V3_CALL, "", V3_CALL, []),
    ("V3 a call and the message end", V3, [T.special_function_tool],
     V3_CALL + "<|message_sep|>\n\n", "", "", SPECIAL),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 6, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    assert truncated(V3, [T.special_function_tool], V3_CALL[:-10]) == 1
    assert truncated(V31, [T.special_function_tool], V31_CALL[:-10]) == 1


@pytest.mark.parametrize(("fmt", "call"), [(GIGACHAT3, V3_CALL), (GIGACHAT3_1, V31_CALL)])
def test_grammars(fmt: CallFormat, call: str) -> None:
    assert required_accepts(fmt, TWO, call)
    assert not required_accepts(fmt, TWO, call + call)  # one call a turn
    assert not required_accepts(fmt, TWO, call.replace('"arg1": 1', '"arg1": "x"'))
    assert not required_accepts(fmt, TWO, HELLO)
    lazy = fmt.grammar(TWO, ToolChoice("auto"), parallel=True)
    assert lazy.lazy and accepts(lazy.gbnf, call)


def test_lazy_triggers() -> None:
    """GigaChat 3's opening is several tokens (a pattern); 3.1's is one special token."""
    v3 = GIGACHAT3.grammar(TWO, ToolChoice("auto"), parallel=True)
    assert v3.trigger_words == () and len(v3.trigger_patterns) == 1
    v31 = GIGACHAT3_1.grammar(TWO, ToolChoice("auto"), parallel=True)
    assert v31.trigger_words == ("<|function_call|>",)


def test_detection() -> None:
    assert detected(V3) is GIGACHAT3 and detected(V31) is GIGACHAT3_1
    assert thinking_syntax((TEMPLATES / V3).read_text()) is None


@pytest.mark.parametrize(("name", "fmt", "call"), [(V3, GIGACHAT3, V3_CALL),
                                                   (V31, GIGACHAT3_1, V31_CALL)])  # fmt: skip
def test_a_past_call_renders_as_the_grammar_writes_it(
    name: str, fmt: CallFormat, call: str
) -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok")])
    assert_renders(name, messages, (T.special_function_tool,), call, fmt)
