"""The one accumulator of parsed output (server/serving/state.py) that every API reads."""

from __future__ import annotations

from chat.callstream import Delta
from server.serving.state import ParsedOutput, openai_calls, parsed

DELTAS = [
    Delta("reasoning", "think "), Delta("content", "Hello"), Delta("reasoning", "more"),
    Delta("start", "get_weather", 0, "call_a"), Delta("args", '{"city": ', 0),
    Delta("start", "get_time", 1, "call_b"), Delta("args", '"Paris"}', 0),
    Delta("args", "{}", 1), Delta("content", " world"),
]  # fmt: skip


def test_text_and_reasoning_are_joined_in_order() -> None:
    out = parsed(DELTAS)
    assert out.content == "Hello world"
    assert out.reasoning == "think more"


def test_arguments_go_to_their_own_call_by_index() -> None:
    out = parsed(DELTAS)
    assert [(c.index, c.call_id, c.name, c.arguments) for c in out.calls] == [
        (0, "call_a", "get_weather", '{"city": "Paris"}'),
        (1, "call_b", "get_time", "{}"),
    ]
    assert out.call(1).name == "get_time"


def test_fed_in_increments_it_equals_fed_at_once() -> None:
    out = ParsedOutput()
    for d in DELTAS:
        out.add([d])
    assert (out.content, out.reasoning, out.calls) == (
        parsed(DELTAS).content, parsed(DELTAS).reasoning, parsed(DELTAS).calls)  # fmt: skip


def test_openai_shape() -> None:
    assert openai_calls(parsed(DELTAS).calls)[0] == {
        "id": "call_a", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }  # fmt: skip
