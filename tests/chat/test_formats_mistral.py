"""Ministral 3 / Devstral's `[TOOL_CALLS]NAME[ARGS]{..}` calls and `[THINK]` blocks,
against the cases of llama.cpp's tests/test-chat.cpp (the Ministral-3-14B-Reasoning-2512
and Devstral blocks): the plan's parser fed whole and in pieces, the grammars checked by
llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls rendered through
both templates. Not ported: the response-format case (llama.cpp's handler asks for the
document in a ```json fence; kvserve's response_format grammar writes the bare document)
and the two continuation cases (an assistant prefill continues as plain text here)."""

from __future__ import annotations

import pytest

from chat.formats_mistral import MINISTRAL3, MISTRAL_SMALL
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import MINISTRAL_THINKING, thinking_syntax
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    TEMPLATES,
    USER,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    replayed,
    required_accepts,
    template,
    truncated,
)

M3 = "mistralai-Ministral-3-14B-Reasoning-2512.jinja"
DEVSTRAL = "unsloth-mistral-Devstral-Small-2507.jinja"
THOUGHTS = "[THINK]I'm\nthinking[/THINK]"
SPECIAL_CALL = '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
OPT_CALL = '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}'
TWO = [T.special_function_tool, T.special_function_tool_with_optional_param]
BOTH = [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]


# (the test-chat.cpp case, template, tools, output, reasoning, content, calls[, format])
CASES = cases(None, [
    ("content", M3, [], HELLO, "", HELLO, []),
    ("reasoning_format none", M3, [], THOUGHTS + HELLO, "", THOUGHTS + HELLO, [], "none"),
    ("reasoning and content", M3, [], THOUGHTS + HELLO, "I'm\nthinking", HELLO, []),
    ("a call", M3, [T.special_function_tool], '[TOOL_CALLS]special_function[ARGS]{"arg1":1}',
     "", "", SPECIAL),
    ("a call after reasoning", M3, [T.special_function_tool],
     THOUGHTS + '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', "I'm\nthinking", "", SPECIAL),
    ("parallel calls", M3, TWO, SPECIAL_CALL + OPT_CALL, "", "", BOTH),
    ("fake tool call marker in reasoning", M3, [T.special_function_tool],
     '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
     + SPECIAL_CALL, 'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more',
     "", SPECIAL),
    ("Devstral: content", DEVSTRAL, [], HELLO, "", HELLO, []),
    ("Devstral: a call", DEVSTRAL, [T.special_function_tool], SPECIAL_CALL, "", "", SPECIAL),
    ("Devstral: content and a call", DEVSTRAL, [T.special_function_tool], HELLO + SPECIAL_CALL,
     "", HELLO, SPECIAL),
    # kvserve's own: strings may hold braces and markers; no JSON after [ARGS] is text;
    # a call cut off is not reported; no tools: a marker is content
    ("braces and a marker in a string", M3, [T.python_tool],
     '[TOOL_CALLS]python[ARGS]{"code": "d = {\\"a\\": \\"}[TOOL_CALLS]\\"}"}', "", "",
     [("python", {"code": 'd = {"a": "}[TOOL_CALLS]"}'})]),
    ("no object after [ARGS]", M3, [T.python_tool], "[TOOL_CALLS]python[ARGS]print(1)", "",
     "[TOOL_CALLS]python[ARGS]print(1)", []),
    ("a call cut off", M3, [T.python_tool], '[TOOL_CALLS]python[ARGS]{"code": "pri', "", "", []),
    ("no tools offered", M3, [], SPECIAL_CALL, "", SPECIAL_CALL, []),
    ("text after the calls", M3, [T.special_function_tool], SPECIAL_CALL + " Done.", "",
     "Done.", SPECIAL),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 4, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    for cut in ('[TOOL_CALLS]python[ARGS]{"code": "pri', "[TOOL_CALLS]pyth"):
        assert truncated(M3, [T.python_tool], "Sure." + cut) == 1, cut


@pytest.mark.parametrize("text", [
    SPECIAL_CALL,
    '[TOOL_CALLS]special_function[ARGS]{"arg1":1}',
    THOUGHTS + SPECIAL_CALL,
    SPECIAL_CALL + OPT_CALL,
    '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1}',
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(MINISTRAL3, TWO, text)


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS]special_function{"arg1": 1}',  # no [ARGS]
    '[TOOL_CALLS]special_function[ARGS]{"arg1": "1"}',  # a string for an integer
    '[TOOL_CALLS]other[ARGS]{"arg1": 1}',  # not offered
    '[TOOL_CALLS]special_function[ARGS]{}',  # a required argument left out
    '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}}]',  # Mistral's list
    HELLO + SPECIAL_CALL,  # text before a forced call
    HELLO,  # no call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(MINISTRAL3, TWO, text)


def test_lazy_grammar_named_and_parallel_off() -> None:
    spec = MINISTRAL3.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("[TOOL_CALLS]",)
    assert accepts(spec.gbnf, SPECIAL_CALL)
    assert not accepts(spec.gbnf, SPECIAL_CALL + SPECIAL_CALL)
    opts = ChatOptions(tools=tuple(TWO), tool_choice=ToolChoice("named", "special_function"))
    named = plan_chat(template(M3), USER, opts).grammar
    assert named is not None and not named.lazy
    assert accepts(named.gbnf, SPECIAL_CALL)
    assert not accepts(named.gbnf, OPT_CALL)


def test_calls_or_a_document() -> None:
    document = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = MINISTRAL3.grammar(TWO, ToolChoice("auto"), True, document)
    assert not spec.lazy
    assert accepts(spec.gbnf, SPECIAL_CALL)
    assert accepts(spec.gbnf, THOUGHTS + '{"a": 3}')
    assert not accepts(spec.gbnf, '{"a": "x"}')


def test_detection_and_thinking_syntax() -> None:
    """llama.cpp sends both templates to its Ministral 3 handler; Mistral Small 3.2 (an id
    between the name and [ARGS]) is its neighbour and Nemo (a JSON list) is not."""
    assert detected(M3) is MINISTRAL3 and detected(DEVSTRAL) is MINISTRAL3
    assert detected("Mistral-Small-3.2-24B-Instruct-2506.jinja") is MISTRAL_SMALL
    assert detected("mistralai-Mistral-Nemo-Instruct-2407.jinja") is not MINISTRAL3
    assert thinking_syntax((TEMPLATES / M3).read_text()) is MINISTRAL_THINKING
    assert thinking_syntax((TEMPLATES / DEVSTRAL).read_text()) is None


@pytest.mark.parametrize("name", [M3, DEVSTRAL])
def test_past_calls_render_as_the_grammar_writes_them(name: str) -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("special_function_with_opt", '{"arg1": 1, "arg2": 2}', "fine")])  # fmt: skip
    text = assert_renders(name, messages, tuple(TWO), SPECIAL_CALL + OPT_CALL, MINISTRAL3)
    assert "[TOOL_RESULTS]ok[/TOOL_RESULTS][TOOL_RESULTS]fine[/TOOL_RESULTS]" in text


def test_past_reasoning_renders_as_a_thinking_block() -> None:
    """llama.cpp's handler: a turn's reasoning_content is the template's thinking block."""
    messages = past_calls([("special_function", '{"arg1": 1}', "ok")])
    messages[1] = {**messages[1], "content": "Sure.", "reasoning_content": "I'm\nthinking"}
    opts = ChatOptions(tools=(T.special_function_tool,))
    text = plan_chat(template(M3), messages, opts).prompt.text
    assert "[/INST]" + THOUGHTS + "Sure." + SPECIAL_CALL in text
    devstral = plan_chat(template(DEVSTRAL), messages, opts).prompt.text
    assert "[/INST]Sure." + SPECIAL_CALL in devstral  # its template has no thinking blocks


@pytest.mark.parametrize("name", [M3, DEVSTRAL])
def test_a_sampled_call_replays(name: str) -> None:
    """A call turn sent back renders as it was sampled (chat/replay.py): the second
    prompt extends the first by the sampled text, so its KV reaches past the call."""
    sampled = THOUGHTS + '[TOOL_CALLS]special_function[ARGS]{"arg1":1}'
    first, second, _ = replayed(name, (T.special_function_tool,), sampled,
                                [("special_function", '{"arg1": 1}', "ok")], eos="</s>")  # fmt: skip
    assert second.startswith(first + sampled + "</s>[TOOL_RESULTS]ok[/TOOL_RESULTS]")


SMALL = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
ID_CALL = '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}'
SMALL_CASES = cases(None, [
    ("Mistral Small 3.2: content", SMALL, [], HELLO, "", HELLO, []),
    ("Mistral Small 3.2: a call", SMALL, [T.special_function_tool], ID_CALL, "", "", SPECIAL),
    ("Mistral Small 3.2: parallel calls", SMALL, TWO,
     '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
     "", "", BOTH),
])  # fmt: skip


test_mistral_small_parser_matches_llama_cpp = parser_test(SMALL_CASES, (1, 4, 100_000))


def test_mistral_small_calls_keep_their_sampled_ids() -> None:
    """llama.cpp reports the sampled id; the template demands it back (9 characters)."""
    from tests.chat.parse_run import deltas

    opts = ChatOptions(tools=tuple(TWO))
    parser = plan_chat(template(SMALL), USER, opts).parser()
    starts = [d for d in deltas(parser, ID_CALL + OPT_CALL.replace("[ARGS]", "[CALL_ID]abcDEF123[ARGS]"), 3)
              if d.kind == "start"]  # fmt: skip
    assert [(d.text, d.call_id) for d in starts] == [
        ("special_function", "123456789"), ("special_function_with_opt", "abcDEF123")]  # fmt: skip


def test_mistral_small_grammar_and_render() -> None:
    assert detected(SMALL) is MISTRAL_SMALL
    spec = MISTRAL_SMALL.grammar(TWO, ToolChoice("required"), parallel=True)
    assert accepts(spec.gbnf, ID_CALL)
    assert not accepts(spec.gbnf, SPECIAL_CALL)  # no id
    assert not accepts(spec.gbnf, ID_CALL.replace("123456789", "12345"))  # not 9 characters
    messages = past_calls([("special_function", '{"arg1": 1}', "ok")], ids=("123456789",))
    assert_renders(SMALL, messages, tuple(TWO), ID_CALL, MISTRAL_SMALL, eos="</s>")


def test_mistral_small_sampled_call_replays() -> None:
    """The call sent back with its sampled id renders as sampled, its results after it."""
    sampled = '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1":1}'
    first, second, _ = replayed(SMALL, (T.special_function_tool,), sampled,
                                [("special_function", '{"arg1": 1}', "ok")], eos="</s>",
                                ids=("123456789",))  # fmt: skip
    assert second.startswith(first + sampled + "</s>")
    assert "ok" in second[len(first + sampled) :]
