"""Exact reuse that pays on every family (issue 49), on the random-weight models of
tests/helpers/family_models.py: with `exact_reuse = true` a conversation's exact
extension reuses all of its prefix but the recomputed rows, and an agent loop (3
conversations of 4 turns on one slot, RAM and disk tiers) computes at most 1.5x the
prompt tokens the default mode computes, every reply equal to a cold engine's by
token and log-probability.

    pytest -s -m model tests/integration/test_exact_reuse_families.py

prints the table (family, prompt tokens computed exact / default / cold, wrong).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import CacheConfig, Engine, GenerateRequest
from engine.types import TokenLogprob
from tests.helpers.exact import reused
from tests.helpers.family_models import FAMILIES, VOCAB, FamilyModel
from tests.integration.test_family_reuse import GREEDY, World, start

pytestmark = pytest.mark.model

MAX_TOKENS = 6
HEAD = 128  # the system prompt the three conversations share
FIRST = 60  # each conversation's first user message
TURNS = 4
TOOL_RESULTS = (24, 90, 40, 120, 16, 70)  # ids added by each later turn (agent-like)

Reply = tuple[tuple[int, ...], tuple[TokenLogprob, ...], int]  # tokens, logprobs, reused

# What each family's tests measured: its row of the table printed at the end.
_EXTENSION: dict[str, str] = {}
_LOOP: dict[str, str] = {}

# The models' 32-token window is shorter than the 64 rows exact reuse computes again, so
# a window's state from the cache cannot be cut back to where a later turn's recompute
# starts: a turn that adds fewer than 64 rows computes them and 64 more, from the state
# saved at the previous prompt's reuse limit (an attention model cuts its state there).
# Measured 1.51x; the real models' windows (128 to 4,096) leave room for the fix
# (docs/cache.md "Reuse, and exact reuse").
WINDOW_OVER = pytest.mark.xfail(strict=True, reason="windowed: 1.51x (see WINDOW_OVER)")
LOOP_FAMILIES = [
    pytest.param(arch, marks=WINDOW_OVER) if kind == "sliding-window" else arch
    for arch, kind in FAMILIES.items()
]


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    yield
    if _LOOP or _EXTENSION:
        print("\nfamily | A then A + 20 ids: reused | agent loop, prompt tokens computed:"
              " exact / default / cold | wrong")  # fmt: skip
        for arch in FAMILIES:
            print(f"{arch} | {_EXTENSION.get(arch, '-')} | {_LOOP.get(arch, '-')}")


async def answer(engine: Engine, prompt: tuple[int, ...]) -> Reply:
    request = GenerateRequest(uuid.uuid4().hex, prompt, GREEDY, max_tokens=MAX_TOKENS,
                              logprobs=5)  # fmt: skip
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    cached = -1
    async for _, out in await engine.generate([request]):
        assert out.error is None, out.error
        tokens.extend(out.token_ids)
        logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return tuple(tokens), tuple(logprobs), cached


def caches(disk: Path | None) -> CacheConfig:
    return CacheConfig(block_tokens=32, min_tokens=32, ram_bytes=8 << 20,
                       disk_dir=str(disk) if disk is not None else "")  # fmt: skip


@pytest.mark.parametrize("arch", tuple(FAMILIES))
async def test_an_exact_extension_reuses_all_but_the_recomputed_rows(
    arch: str, family_models: dict[str, FamilyModel]
) -> None:
    """A, then A and 20 ids more, on one slot: the second reuses all of A but the rows
    exact reuse computes again (from the slot, or from the state saved on the way)."""
    path = family_models[arch].path
    cold = await start(path, n_seq_max=1, cache=None)
    warm = await start(path, n_seq_max=1, cache=caches(None))
    try:
        world = World(warm, cold, random.Random(0), range(VOCAB))
        first = world.ids("a", 300)
        rows = warm.info.exact_min_rows
        for prompt, least in ((first, 0), (first + world.ids("b", 20), reused(len(first), rows))):
            got, expected = await answer(warm, prompt), await answer(cold, prompt)
            assert got[:2] == expected[:2], (arch, len(prompt), got[2])
            assert got[2] >= least, (arch, len(prompt), got[2], least)
        _EXTENSION[arch] = f"{got[2]} of {len(prompt)} (exact rows {rows})"
        stats = warm.stats()
        assert stats is not None and stats.num_refused_drops == 0
    finally:
        warm.close()
        cold.close()


async def agent_loop(warm: Engine, cold: Engine, world: World) -> tuple[int, int, int]:
    """3 conversations of TURNS turns, turn by turn in turns (one slot: each turn finds
    another conversation's KV in it); each turn adds the cold reply and a tool result.
    (prompt tokens computed, prompt tokens in all, replies unlike the cold engine's)."""
    head = world.ids("system", HEAD)
    histories = [head + world.ids(("user", c), FIRST) for c in range(3)]
    computed = total = wrong = 0
    for turn in range(TURNS):
        for c, history in enumerate(histories):
            got = await answer(warm, history)
            expected = await answer(cold, history)
            computed += len(history) - got[2]
            total += len(history)
            wrong += got[:2] != expected[:2]
            result = TOOL_RESULTS[(turn * 3 + c) % len(TOOL_RESULTS)]
            histories[c] = history + expected[0] + world.ids(("tool", c, turn), result)
    return computed, total, wrong


@pytest.mark.parametrize("arch", LOOP_FAMILIES)
async def test_an_agent_loop_under_exact_reuse_computes_at_most_1_5x_the_default(
    arch: str, family_models: dict[str, FamilyModel], tmp_path: Path
) -> None:
    path = family_models[arch].path
    cold = await start(path, n_seq_max=1, cache=None)
    try:
        figures: dict[bool, tuple[int, int, int]] = {}
        why: dict[str, int] = {}
        for exact in (True, False):
            warm = await start(path, n_seq_max=1, cache=caches(tmp_path / f"disk-{exact}"),
                               exact_reuse=exact)  # fmt: skip
            try:
                world = World(warm, cold, random.Random(0), range(VOCAB))
                figures[exact] = await agent_loop(warm, cold, world)
                stats = warm.stats()
                assert stats is not None and stats.num_refused_drops == 0
                if exact:
                    why = dict(stats.cold_reasons)
            finally:
                warm.close()
    finally:
        cold.close()
    (computed, total, wrong), default = figures[True], figures[False][0]
    _LOOP[arch] = f"{computed} / {default} / {total} | {wrong} (cold why: {why or 'none'})"
    assert wrong == 0, arch
    assert computed <= 1.5 * default, (arch, computed, default, why)
