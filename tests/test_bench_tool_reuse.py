"""bench/tool_reuse.py's loop and figures without a model: a conversation of TURNS turns
against the app on the fake engine (Hermes template), turn 1 forced, later turns free,
a tool result after each call and the next question after a text answer; the medians
and the table add up."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from bench.tool_reuse import HERMES, TURNS, TurnFigures, conversation, summarize, table
from server.app import create_app
from server.config.tree import ModelSection, Settings
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def fake() -> FakeEngine:
    engine = FakeEngine(n_ctx=16384)
    engine.replies = [WEATHER, "It is cloudy.", TIME, "It is 14:05."]
    engine.cached = 7
    return engine


@pytest.fixture
async def client(fake: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(models=(ModelSection(id=MODEL, chat_template=str(HERMES)),))
    transport = httpx.ASGITransport(app=create_app(settings, engine=fake))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


def prompt(fake: FakeEngine, turn: int) -> str:
    return bytes(fake.submitted[turn - 1].prompt_tokens).decode()  # fake tokens are bytes


async def test_a_conversation_forces_turn_1_and_sends_results_and_questions_back(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    figures = await conversation(client, MODEL, "Paris", max_tokens=200)  # fake tokens: bytes
    assert [f.turn for f in figures] == list(range(1, TURNS + 1))
    assert [f.calls for f in figures] == [1, 0, 1, 0]
    lazy = [r.sampling.grammar_lazy for r in fake.submitted]
    assert fake.submitted[0].sampling.grammar and lazy == [False, True, True, True]
    assert all(f.cached_tokens == 7 for f in figures)
    assert [f.computed for f in figures] == [len(r.prompt_tokens) - 7 for r in fake.submitted]
    # turn 2 follows the weather call's result; turn 3 the next question; turn 4 the time's
    assert '"sky": "cloudy"' in prompt(fake, 2)
    assert prompt(fake, 3).rstrip().endswith("And the local time in Paris?<|im_end|>\n"
                                              "<|im_start|>assistant")  # fmt: skip
    assert '"time": "14:05"' in prompt(fake, 4)
    for turn in range(2, TURNS + 1):  # each prompt extends the one before it
        assert prompt(fake, turn).startswith(prompt(fake, turn - 1))
        assert len(fake.submitted[turn - 1].prompt_tokens) == figures[turn - 1].prompt_tokens


def test_summarize_takes_the_median_per_turn_and_the_table_the_total() -> None:
    runs = [
        [TurnFigures(1, 100, 0, 1), TurnFigures(2, 150, 90, 0)],
        [TurnFigures(1, 110, 10, 1), TurnFigures(2, 170, 150, 1)],
        [TurnFigures(1, 120, 0, 1), TurnFigures(2, 160, 100, 0)],
    ]
    rows = summarize(runs)  # computed per turn: 100, 100, 120 and 60, 20, 60
    assert rows == [
        {"turn": 1, "prompt_tokens": 110, "cached_tokens": 0, "computed": 100, "calls": 1},
        {"turn": 2, "prompt_tokens": 160, "cached_tokens": 100, "computed": 60, "calls": 0},
    ]
    text = table({"off": rows, "on": rows})
    assert text.splitlines()[3].split() == ["off", "all", "160"]
    assert json.dumps(rows)  # what --json writes
