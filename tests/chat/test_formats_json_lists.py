"""The JSON call objects in the wrappers llama.cpp's autoparser derives from their
templates: Llama 3.2's bare object (one call a turn), Nemotron Nano v2's
`<TOOLCALL>[..]</TOOLCALL>` after `<think>`, Apriel 1.6's `<tool_calls>[..]</tool_calls>`
after its thinking, MiniMax-M1's `<tool_calls>` lines and FireFunction v2's
` functools[..]`. The cases of llama.cpp's tests/test-chat.cpp (its Llama 3.2,
NVIDIA-Nemotron-Nano-v2, Apriel 1.6 and FireFunction blocks; none for MiniMax-M1)
through each template's whole plan, fed whole and in pieces, plus kvserve's own; the
grammars checked by llama.cpp's own grammar engine; past calls rendered through the
templates as the grammars write them. Not ported: the continuation cases (an assistant
prefill continues as plain text)."""

from __future__ import annotations

from typing import Any

import pytest

from chat.callformat import PromptBound
from chat.formats import APRIEL, FIREFUNCTION_V2, LLAMA3_2, MINIMAX_M1, NEMOTRON_V2, ToolFormat
from chat.plan import ChatOptions, plan_chat
from chat.template import TemplateRefusal
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    USER,
    ParseCase,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)

LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
NEMOTRON = "NVIDIA-Nemotron-Nano-v2.jinja"
M1 = "MiniMax-M1.jinja"
FIRE = "fireworks-ai-llama-3-firefunction-v2.jinja"
APRIEL_T = "Apriel-1.6-15b-Thinker-fixed.jinja"
FINAL = "\n[BEGIN FINAL RESPONSE]\n"

SPECIAL_JSON = '{"name": "special_function", "arguments": {"arg1": 1}}'
PARIS_JSON = '{"name": "get_time", "arguments": {"city": "Paris"}}'
TWO_CALLS = [("special_function", {"arg1": 1}), ("get_time", {"city": "Paris"})]
BOTH = [T.special_function_tool, T.get_time_tool]

# (the test-chat.cpp case, template, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("llama 3.2 content", LLAMA32, [T.special_function_tool], HELLO, "", HELLO, []),
    ("nemotron v2 thinking and a call", NEMOTRON, [T.special_function_tool],
     f"I'm\nthinking\n</think>\n<TOOLCALL>[{SPECIAL_JSON}]</TOOLCALL>", "I'm\nthinking", "",
     SPECIAL),
    ("nemotron v2 thinking and a call, blank lines", NEMOTRON, [T.special_function_tool],
     f"I'm\nthinking\n</think>\n\n<TOOLCALL>[{SPECIAL_JSON}]</TOOLCALL>\n", "I'm\nthinking", "",
     SPECIAL),
    ("firefunction content", FIRE, [], HELLO, "", HELLO, []),
    ("firefunction a call", FIRE, [T.special_function_tool], f" functools[{SPECIAL_JSON}]", "",
     "", SPECIAL),
    # llama.cpp's reasoning also holds the prompt's "Here are my reasoning steps:\n" line,
    # which it parses with the output; kvserve's parser reads the output alone
    ("apriel 1.6 thinking and content", APRIEL_T, [], f"I'm\nthinking{FINAL}{HELLO}",
     "I'm\nthinking", HELLO, []),
    ("apriel 1.6 thinking and a call", APRIEL_T, [T.special_function_tool],
     f"I'm\nthinking{FINAL}<tool_calls>[{SPECIAL_JSON}]</tool_calls>", "I'm\nthinking", "",
     SPECIAL),
    # kvserve's own
    ("llama 3.2 a call", LLAMA32, [T.special_function_tool],
     '{"name": "special_function", "parameters": {"arg1": 1}}', "", "", SPECIAL),
    ("nemotron v2 thinking, text, two calls", NEMOTRON, BOTH,
     f"hm\n</think>\nSure.\n<TOOLCALL>[{SPECIAL_JSON}, {PARIS_JSON}]</TOOLCALL>", "hm", "Sure.",
     TWO_CALLS),
    ("nemotron v2 thinking and content", NEMOTRON, [], f"hm\n</think>\n{HELLO}", "hm", HELLO, []),
    ("minimax-m1 content", M1, [T.special_function_tool], HELLO, "", HELLO, []),
    ("minimax-m1 two calls", M1, BOTH,
     f"Sure.\n<tool_calls>\n{SPECIAL_JSON}\n{PARIS_JSON}\n</tool_calls>", "", "Sure.",
     TWO_CALLS),
    ("minimax-m1 a call cut off", M1, BOTH, '<tool_calls>\n{"name": "get_time", "argu', "", "",
     []),
    ("firefunction two calls", FIRE, BOTH, f"Sure. functools[{SPECIAL_JSON}, {PARIS_JSON}]", "",
     "Sure.", TWO_CALLS),
]  # fmt: skip
CASES = [ParseCase(*c) for c in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 7, 100_000))


def test_detection() -> None:
    assert detected(LLAMA32) is LLAMA3_2
    assert detected(NEMOTRON) is NEMOTRON_V2
    assert detected(M1) is MINIMAX_M1
    assert detected(FIRE) is FIREFUNCTION_V2
    assert detected(APRIEL_T) is APRIEL
    assert detected("unsloth-Apriel-1.5.jinja") is not APRIEL
    assert detected("meta-llama-Llama-3.3-70B-Instruct.jinja").name == "llama3"
    assert detected("Apriel-1.6-15b-Thinker-fixed.jinja") is not MINIMAX_M1  # <tool_calls>[


# A forced grammar's calls, as each format writes them (the grammar's own whitespace).
FORCED = [
    (LLAMA3_2, '{"name": "get_time", "parameters": {"city": "Paris"}}'),
    (NEMOTRON_V2, f"<TOOLCALL>[{SPECIAL_JSON}, {PARIS_JSON}]</TOOLCALL>"),
    (NEMOTRON_V2, f"<think>hm</think>\n<TOOLCALL>[{PARIS_JSON}]</TOOLCALL>"),
    (MINIMAX_M1, f"<tool_calls>\n{SPECIAL_JSON}\n{PARIS_JSON}\n</tool_calls>"),
    (FIREFUNCTION_V2, f"functools[{SPECIAL_JSON}, {PARIS_JSON}]"),
    (APRIEL, f"<tool_calls>[{SPECIAL_JSON}, {PARIS_JSON}]</tool_calls>"),
]


@pytest.mark.parametrize(("fmt", "text"), FORCED, ids=lambda v: getattr(v, "name", "text"))
def test_required_grammar_accepts_calls(fmt: ToolFormat, text: str) -> None:
    assert required_accepts(fmt, BOTH, text)


@pytest.mark.parametrize(("fmt", "text"), [
    (LLAMA3_2, '{"name": "get_time", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {"city": "Rome"}}'),  # one call a turn
    (LLAMA3_2, '{"name": "get_time", "arguments": {"city": "Paris"}}'),  # its key is parameters
    (NEMOTRON_V2, f"[{SPECIAL_JSON}]"),  # no <TOOLCALL>
    (NEMOTRON_V2, f"hm {SPECIAL_JSON}"),  # text that is not thinking
    (MINIMAX_M1, f"<tool_calls>\n{SPECIAL_JSON}, {PARIS_JSON}\n</tool_calls>"),  # a list's comma
    (FIREFUNCTION_V2, '[{"name": "special_function", "arguments": {"arg1": "x"}}]'),
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(fmt: ToolFormat, text: str) -> None:
    assert not required_accepts(fmt, BOTH, text)


def test_lazy_grammars_start_at_the_opening() -> None:
    for fmt, word in ((NEMOTRON_V2, "<TOOLCALL>"), (MINIMAX_M1, "<tool_calls>"),
                      (FIREFUNCTION_V2, "functools\\[")):  # fmt: skip
        spec = fmt.grammar(BOTH, ToolChoice("auto"), parallel=True)
        assert spec.lazy and f"({word})" in spec.trigger_patterns[0]


def test_nemotron_prompt_that_opens_thinking_must_close_it_before_a_forced_call() -> None:
    """The generation prompt ends in `<think>\\n`: a call written inside it would be read as
    reasoning, so the forced grammar asks for the close first; with thinking off
    (`<think></think>` in the prompt) the call may come at once."""
    opts = ChatOptions(tools=tuple(BOTH), tool_choice=ToolChoice("required"))
    on = plan_chat(template(NEMOTRON), USER, opts)
    assert on.prompt.text.endswith("<think>\n") and on.grammar is not None
    assert isinstance(NEMOTRON_V2, PromptBound)
    assert accepts(on.grammar.gbnf, f"hm\n</think>\n<TOOLCALL>[{PARIS_JSON}]</TOOLCALL>")
    assert not accepts(on.grammar.gbnf, f"<TOOLCALL>[{PARIS_JSON}]</TOOLCALL>")
    off_opts = ChatOptions(tools=tuple(BOTH), tool_choice=ToolChoice("required"),
                           template_kwargs={"enable_thinking": False})  # fmt: skip
    off = plan_chat(template(NEMOTRON), [{"role": "user", "content": "Hi /no_think"}], off_opts)
    assert off.prompt.text.endswith("<think></think>") and off.grammar is not None
    assert accepts(off.grammar.gbnf, f"<TOOLCALL>[{PARIS_JSON}]</TOOLCALL>")


@pytest.mark.parametrize(("name", "fmt", "rendered"), [
    (LLAMA32, LLAMA3_2, '{"name": "special_function", "parameters": {"arg1": 1}}'),
    (NEMOTRON, NEMOTRON_V2, f"<TOOLCALL>[{SPECIAL_JSON}, {PARIS_JSON}]</TOOLCALL>"),
    (M1, MINIMAX_M1, f"<tool_calls>\n{SPECIAL_JSON}\n{PARIS_JSON}\n</tool_calls>"),
    (FIRE, FIREFUNCTION_V2, f"functools[{SPECIAL_JSON}, {PARIS_JSON}]"),
])  # fmt: skip
def test_past_calls_render_as_the_grammar_writes_them(
    name: str, fmt: ToolFormat, rendered: str
) -> None:
    calls = [("special_function", '{"arg1": 1}', "r1"), ("get_time", '{"city": "Paris"}', "r2")]
    messages = past_calls(calls[:1] if fmt is LLAMA3_2 else calls)
    assert_renders(name, messages, tuple(BOTH), rendered, fmt)


def test_apriel_thinking_the_prompt_opened_closes_before_a_forced_call() -> None:
    """Its prompt always opens the thinking (`Here are my reasoning steps:`)."""
    opts = ChatOptions(tools=tuple(BOTH), tool_choice=ToolChoice("required"))
    plan = plan_chat(template(APRIEL_T), USER, opts)
    assert plan.reasoning_inside and plan.grammar is not None
    call = f"<tool_calls>[{PARIS_JSON}]</tool_calls>"
    assert accepts(plan.grammar.gbnf, f"hm{FINAL}{call}")
    assert not accepts(plan.grammar.gbnf, call)


def test_llama32_refuses_two_calls_in_a_turn() -> None:
    """Its template raises on more than one call: why its grammar writes one."""
    messages = past_calls([("special_function", '{"arg1": 1}', "r1"),
                           ("get_time", '{"city": "Paris"}', "r2")])  # fmt: skip
    with pytest.raises(TemplateRefusal):
        plan_chat(template(LLAMA32), messages, ChatOptions(tools=tuple(BOTH)))
