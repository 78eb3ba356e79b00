"""Kimi K3's `<|open|>` / `<|close|>` sections, against the cases of llama.cpp's
tests/test-chat.cpp (the Kimi-K3 block): the plan's parser fed whole and in pieces (its
prompt opens the think section, or the response section with `thinking` off), the
grammars checked by llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls
rendered through the template."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_kimi3 import KIMI_K3
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import KIMI_K3_THINKING, thinking_syntax
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    TEMPLATES,
    USER,
    ParseCase,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    template,
    truncated,
)

K3 = "Kimi-K3.jinja"
OFF = {"template_kwargs": {"thinking": False}}


def resp(text: str) -> str:
    return f"<|open|>response<|sep|>{text}<|close|>response<|sep|>"


def arg(key: str, kind: str, value: str) -> str:
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'


def call(name: str, index: int, *args: str) -> str:
    return (
        f'<|open|>call tool="{name}" index="{index}"<|sep|>'
        + "".join(args)
        + "<|close|>call<|sep|>"
    )


def tools(*calls: str) -> str:
    return "<|open|>tools<|sep|>" + "".join(calls) + "<|close|>tools<|sep|>"


END = "<|close|>message<|sep|>"
SPECIAL_CALL = call("special_function", 1, arg("arg1", "number", "1"))
OPT_CALL = call(
    "special_function_with_opt", 1, arg("arg1", "number", "1"), arg("arg2", "number", "2")
)
OPT = [("special_function_with_opt", {"arg1": 1, "arg2": 2})]
TWO = [T.special_function_tool, T.special_function_tool_with_optional_param]

# (the test-chat.cpp case, tools, output, reasoning, content, calls[, reasoning_format])
CASES = cases(K3, [
    ("content only", [], resp(HELLO) + END, "", HELLO, []),
    ("reasoning without its opening", [], "I'm thinking about this<|close|>think<|sep|>"
     + resp(HELLO) + END, "I'm thinking about this", HELLO, []),
    ("prose naming the tags", [], resp("Use the response tag, then message the handler.") + END,
     "", "Use the response tag, then message the handler.", []),
    ("cut off while thinking", [], "I was still thinking when the budget ran out",
     "I was still thinking when the budget ran out", "", []),
    ("one call", [T.special_function_tool], resp("") + tools(SPECIAL_CALL) + END, "", "",
     SPECIAL),
    ("reasoning, content and a call", [T.special_function_tool], "I should call it"
     "<|close|>think<|sep|>" + resp("On it.") + tools(SPECIAL_CALL) + END, "I should call it",
     "On it.", SPECIAL),
    ("typed arguments", [T.special_function_tool_with_optional_param],
     resp("") + tools(OPT_CALL) + END, "", "", OPT),
    ("parallel calls", TWO, resp("") + tools(SPECIAL_CALL, OPT_CALL.replace('index="1"',
     'index="2"')) + END, "", "", SPECIAL + OPT),
    ("a string argument", [T.python_tool], resp("") + tools(call("python", 1, arg(
     "code", "string", "print('hey')"))) + END, "", "", [("python", {"code": "print('hey')"})]),
    # kvserve's own: the message's end token; no tools offered; reasoning_format none
    ("the end token", [], resp(HELLO) + END + "<|end_of_msg|>", "", HELLO, []),
    ("no tools offered", [], resp("") + tools(SPECIAL_CALL) + END, "", tools(SPECIAL_CALL), []),
    ("reasoning_format none", [], "hm<|close|>think<|sep|>" + resp(HELLO), "", "hm" + HELLO,
     [], "none"),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 7, 100_000))


@pytest.mark.parametrize("step", [1, 100_000])
def test_thinking_off_the_prompt_opened_the_response(step: int) -> None:
    opts: dict[str, Any] = {"tools": (T.special_function_tool,), **OFF}
    case = ParseCase("thinking off", K3, [T.special_function_tool],
                     HELLO + "<|close|>response<|sep|>" + tools(SPECIAL_CALL) + END, "", HELLO,
                     SPECIAL, {k: v for k, v in opts.items() if k != "tools"})  # fmt: skip
    case.check(step)


def test_a_cut_off_call_counts_as_truncated() -> None:
    cut = resp("") + tools(SPECIAL_CALL)[:60]
    assert truncated(K3, [T.special_function_tool], cut) == 1


def _forced(opened: str) -> Any:
    return KIMI_K3.for_prompt(opened).grammar(TWO, ToolChoice("required"), parallel=True)


@pytest.mark.parametrize("text", [
    "plan<|close|>think<|sep|>" + tools(SPECIAL_CALL),
    "plan<|close|>think<|sep|>" + resp("On it.") + tools(SPECIAL_CALL, OPT_CALL) + END,
    "<|close|>think<|sep|>" + tools(call("special_function_with_opt", 1, arg("arg1", "number", "1"))),
])  # fmt: skip
def test_forced_grammar_after_the_think_opening(text: str) -> None:
    spec = _forced("..<|open|>think<|sep|>")
    assert not spec.lazy and accepts(spec.gbnf, text)


@pytest.mark.parametrize("text", [
    tools(SPECIAL_CALL),  # the thinking the prompt opened must close first
    "plan<|close|>think<|sep|>" + tools(call("special_function", 1, arg("arg1", "number", '"1"'))),
    "plan<|close|>think<|sep|>" + tools(call("special_function", 1, arg("arg1", "string", "1"))),
    "plan<|close|>think<|sep|>" + tools(call("other", 1, arg("arg1", "number", "1"))),
    "plan<|close|>think<|sep|>" + resp(HELLO),  # no call
])  # fmt: skip
def test_forced_grammar_rejects(text: str) -> None:
    assert not accepts(_forced("..<|open|>think<|sep|>").gbnf, text)


def test_forced_grammar_after_the_response_opening() -> None:
    spec = _forced("..<|open|>response<|sep|>")
    assert accepts(spec.gbnf, "On it.<|close|>response<|sep|>" + tools(SPECIAL_CALL))
    assert accepts(spec.gbnf, tools(SPECIAL_CALL))
    assert not accepts(spec.gbnf, "plan<|close|>think<|sep|>" + tools(SPECIAL_CALL))


def test_lazy_grammar_and_a_document() -> None:
    spec = KIMI_K3.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|open|>tools<|sep|>",)
    assert accepts(spec.gbnf, tools(SPECIAL_CALL) + END)
    assert not accepts(spec.gbnf, tools(SPECIAL_CALL, SPECIAL_CALL))
    document = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    bound = KIMI_K3.for_prompt("<|open|>think<|sep|>")
    with_doc = bound.grammar(TWO, ToolChoice("auto"), True, document)
    assert accepts(with_doc.gbnf, 'p<|close|>think<|sep|><|open|>response<|sep|>{"a": 3}'
                                  "<|close|>response<|sep|>")  # fmt: skip


def test_detection_and_thinking_syntax() -> None:
    assert detected(K3) is KIMI_K3
    assert detected("Kimi-K2-Thinking.jinja") is not KIMI_K3
    assert thinking_syntax((TEMPLATES / K3).read_text()) is KIMI_K3_THINKING
    plan = plan_chat(template(K3), USER, ChatOptions(tools=(T.special_function_tool,)))
    assert plan.tool_format is not None and plan.tool_format.name == "kimi-k3"


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", '{"code": "print(1)"}', "fine")])  # fmt: skip
    rendered = tools(SPECIAL_CALL, call("python", 2, arg("code", "string", "print(1)")))
    text = assert_renders(K3, messages, (T.special_function_tool, T.python_tool), rendered,
                          KIMI_K3.for_prompt("<|open|>response<|sep|>"))  # fmt: skip
    assert rendered + END in text
