"""bench/agent_workloads.py's named shapes produce what they claim, and bench/agents.py
runs them with their parts (no server started)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from bench import agents
from bench.agent_workloads import SHAPES, Shape, longest_prompt_words, make_workload
from engine.llama import Model
from server.config.tree import default_model_path

# Measured with SmolLM2's tokenizer on every shape's catalogue: 2.89-2.90 characters a
# token (the model test below checks the tokens themselves). 10% either way.
CHARS_PER_TOKEN = (2.9 * 0.9, 2.9 * 1.1)


def workload(shape: Shape, seed: int = 7):  # type: ignore[no-untyped-def]
    return make_workload(seed, shape.agents, shape.turns, shape.catalogue_words,
                         shape.task_words, shape.result_words)  # fmt: skip


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_shape_has_the_agents_turns_and_catalogue_it_claims(name: str) -> None:
    shape = SHAPES[name]
    work = workload(shape)
    assert len(work.tasks) == shape.agents
    assert [len(r) for r in work.results] == [shape.turns] * shape.agents
    low, high = shape.catalogue_tokens
    assert low * CHARS_PER_TOKEN[0] <= len(work.system) <= high * CHARS_PER_TOKEN[1]
    assert shape.agents > shape.slots  # the point of the benchmark: agents outnumber slots
    # n_ctx holds the last turn's prompt (the catalogue at the most its range allows, about
    # 2.2 tokens a word for the rest) and every reply, with the chat template's tokens to
    # spare
    rest = longest_prompt_words(shape) - shape.catalogue_words
    last = high + 2.2 * rest + shape.turns * (shape.reply_tokens + 16)
    assert last <= shape.n_ctx


def test_the_issue_shapes_are_there() -> None:
    long = SHAPES["long-catalogue"]  # issue 30 item 3
    assert (long.agents, long.turns, long.slots) == (6, 3, 2)
    # as near 8k as SmolLM2's training context (8,192 tokens, where llama-server caps a
    # slot) leaves room for the turns
    assert long.catalogue_tokens[0] >= 7000 and long.disk_cache
    assert long.n_ctx <= 8192
    ref = SHAPES["default"]
    assert (ref.agents, ref.turns, ref.slots) == (16, 4, 4)
    # the larger shapes: more agents and more slots, fewer turns, longer catalogues
    for name in ("large", "wide"):
        big = SHAPES[name]
        assert big.agents > ref.agents and big.slots > ref.slots and big.turns < ref.turns
        assert big.catalogue_words > ref.catalogue_words


def test_the_workload_is_the_same_for_the_same_seed_only() -> None:
    shape = SHAPES["default"]
    assert workload(shape, 7) == workload(shape, 7)
    assert workload(shape, 7).system != workload(shape, 8).system


def parse(*argv: str) -> argparse.Namespace:
    keys = ("shape", "agents", "turns", "slots", "catalogue_words", "task_words",
            "result_words", "reply_tokens", "n_ctx", "disk_cache")  # fmt: skip
    args = argparse.Namespace(**dict.fromkeys(keys))
    args.shape = "default"
    for item in argv:
        key, value = item.split("=")
        setattr(args, key, value if key == "shape" else int(value))
    return args


def test_agents_fills_the_flags_left_unset_from_the_shape() -> None:
    args = parse("shape=long-catalogue", "agents=3")
    shape = agents.resolve_shape(args)
    assert shape is SHAPES["long-catalogue"]
    assert (args.agents, args.turns, args.slots) == (3, 3, 2)  # the flag wins over the shape
    assert args.n_ctx == shape.n_ctx and args.disk_cache is True
    assert args.catalogue_words == shape.catalogue_words


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    loaded = Model(default_model_path())
    yield loaded
    loaded.close()


@pytest.mark.model
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_catalogue_has_the_tokens_claimed(model: Model, name: str) -> None:
    shape = SHAPES[name]
    count = len(model.tokenize(workload(shape).system, add_special=False, parse_special=False))
    low, high = shape.catalogue_tokens
    assert low <= count <= high


def test_prefix_sources_are_read_from_the_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(
        [
            "# TYPE kvserve_cache_request_sources_total counter",
            'kvserve_cache_request_sources_total{model="m",source="none"} 1.0',
            'kvserve_cache_request_sources_total{model="m",source="ram"} 7.0',
            'kvserve_cache_request_sources_total{model="m",source="disk"} 5.0',
            'kvserve_cache_requests_total{kind="cold",model="m"} 1.0',
        ]
    )
    asked = []

    def get(url: str) -> argparse.Namespace:
        asked.append(url)
        return argparse.Namespace(text=text)

    monkeypatch.setattr(agents.httpx, "get", get)
    assert agents.prefix_sources("http://h:1/v1") == {"none": 1, "ram": 7, "disk": 5}
    assert asked == ["http://h:1/metrics"]
