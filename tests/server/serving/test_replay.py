"""server/serving/replay.py: the memory of sampled tool turns (bounds, tenants, matching)."""

from __future__ import annotations

from typing import Any

from chat.plan import OutputParser
from chat.replay import prompt_digest
from engine.client import FinishReason
from server.serving.replay import Recorder, Replay, ReplayMemories, ReplayMemory
from server.serving.state import Choice, ChoiceState, ParsedCall

PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def call(call_id: str, arguments: str = '{"city":"Paris"}') -> ParsedCall:
    return ParsedCall(0, call_id, "get_weather", arguments)


def sent(call_id: str, arguments: str = '{"city": "Paris"}', content: Any = None) -> dict[str, Any]:
    fn = {"name": "get_weather", "arguments": arguments}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "function": fn}],
    }


def test_a_turn_sent_back_finds_what_was_sampled() -> None:
    replay = Replay(ReplayMemory(1 << 20), "tenant-a")
    replay.record(PROMPT, "SAMPLED", "", [call("call_1")])
    (turn,) = replay.lookup(sent("call_1"))
    assert turn.text == "SAMPLED" and turn.prompt_digest == prompt_digest(PROMPT)
    assert replay.lookup(sent("call_1", '{"city":"Lyon"}')) == []  # edited arguments
    assert replay.lookup(sent("call_1", '{"city": "Paris", "days": 1}')) == []
    assert replay.lookup(sent("call_1", '{"city": "Paris"', "")) == []  # not JSON
    assert replay.lookup(sent("call_1", content="I will look.")) == []  # edited content
    assert replay.lookup(sent("call_2")) == []  # an unknown id
    assert replay.lookup(sent("call_1", content="  ")) != []  # no content, as "" or null


def test_arguments_compare_as_json_values() -> None:
    replay = Replay(ReplayMemory(1 << 20), "t")
    replay.record(PROMPT, "SAMPLED", "", [call("call_1", '{"n": 1, "flag": true}')])
    assert replay.lookup(sent("call_1", '{"flag":true,"n":1}')) != []
    assert replay.lookup(sent("call_1", '{"flag": 1, "n": 1}')) == []  # 1 is not true
    assert replay.lookup(sent("call_1", '{"flag": true, "n": 1.5}')) == []


def test_tenants_do_not_see_each_others_turns() -> None:
    memory = ReplayMemory(1 << 20)
    Replay(memory, "tenant-a").record(PROMPT, "SAMPLED", "", [call("call_1")])
    assert Replay(memory, "tenant-b").lookup(sent("call_1")) == []
    assert Replay(memory, "tenant-a").lookup(sent("call_1")) != []
    by_calls = Replay(memory, "tenant-a", by_calls=True)
    by_calls.record(PROMPT, "OLLAMA", "", [call("call_9")])
    assert Replay(memory, "tenant-b", by_calls=True).lookup(sent("any")) == []
    assert [t.text for t in by_calls.lookup(sent("any"))] == ["OLLAMA"]


def test_bounded_by_bytes_least_recently_used_first() -> None:
    memory = ReplayMemory(3000)
    replay = Replay(memory, "t")
    for i in range(3):
        replay.record(PROMPT, "x" * 600, "", [call(f"call_{i}")])
    assert len(memory) == 3 and memory.num_bytes <= 3000
    assert replay.lookup(sent("call_0"))  # used: call_1 is now the oldest
    replay.record(PROMPT, "x" * 600, "", [call("call_3")])
    assert memory.num_bytes <= 3000
    assert not replay.lookup(sent("call_1"))
    assert all(replay.lookup(sent(f"call_{i}")) for i in (0, 2, 3))
    replay.record(PROMPT, "x" * 4000, "", [call("call_big")])  # larger than the memory
    assert not replay.lookup(sent("call_big")) and len(memory) == 3


def test_turns_keyed_by_calls_keep_the_newest_few() -> None:
    memory = ReplayMemory(1 << 20)
    replay = Replay(memory, "t", by_calls=True)
    for i in range(6):
        replay.record(PROMPT + str(i), f"SAMPLED {i}", "", [call(f"call_{i}")])
    found = [t.text for t in replay.lookup(sent("whatever"))]
    assert found == ["SAMPLED 5", "SAMPLED 4", "SAMPLED 3", "SAMPLED 2"]
    assert len(memory) == 4


def test_off_at_zero_bytes_and_one_memory_per_model() -> None:
    assert ReplayMemories(0).of("m") is None
    memories = ReplayMemories(1000)
    assert memories.of("a") is memories.of("a") and memories.of("a") is not memories.of("b")


def finished(reason: FinishReason, text: str) -> Choice:
    return Choice(text=[text], finish_reason=reason)


class _Parser(OutputParser):
    """A parser whose output is one call (the recorder reads the state's parsed output)."""

    def __init__(self, truncated: int = 0) -> None:
        super().__init__(None, None)
        self.num_truncated = truncated


def test_the_recorder_keeps_only_whole_turns_that_ended_with_calls() -> None:
    memory = ReplayMemory(1 << 20)
    recorder = Recorder(Replay(memory, "t"), PROMPT)
    for reason, truncated, with_call in [
        (FinishReason.LENGTH, 0, True),  # cut by max_tokens
        (FinishReason.STOP, 1, True),  # a call cut off after the whole ones
        (FinishReason.STOP, 0, False),  # no call
        (FinishReason.ABORT, 0, True),
    ]:
        state = ChoiceState(0, _Parser(truncated), on_finish=recorder.finished)
        if with_call:
            state.output._calls[0] = call("call_1")
        state.advance(finished(reason, "SAMPLED"))
    assert len(memory) == 0
    state = ChoiceState(0, _Parser(), on_finish=recorder.finished)
    state.output._calls[0] = call("call_1")
    state.advance(Choice(text=["SAMP"]))
    state.advance(finished(FinishReason.STOP, "LED"))
    (turn,) = Replay(memory, "t").lookup(sent("call_1", content="SAMPLED"))
    assert turn.text == "SAMPLED"  # the whole text, over the increments
