"""Exact reuse that pays on every family (issue 49), on the random-weight models of
tests/helpers/family_models.py: with `exact_reuse = true` a conversation's exact
extension reuses all of its prefix but the recomputed rows, and an agent loop (3
conversations of 4 turns on one slot, RAM and disk tiers) computes at most 1.5x the
prompt tokens the default mode computes, every reply equal to a cold engine's by
token and log-probability.

    pytest -s -m model tests/integration/test_exact_reuse_families.py

prints the table (family, prompt tokens computed exact / default / cold, wrong).

The sliding-window models' loop runs on copies whose window is 128 (the smallest real
one: gpt-oss), not the writer's 32: a window's state can be cut back to a later turn's
reuse limit only when its window reaches over the recomputed rows (64 with flash
attention: SchedulerConfig.window_recut), which every real windowed model's does.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import gguf
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

# The writer's 32-token window is shorter than the 64 rows exact reuse computes again: a
# state saved at a prompt's end holds window cells for its last 32 positions only, and
# those the tail checkpoint holds end 64 before it, so no blob can be cut back to where a
# later turn's recompute starts (a turn adding fewer than 64 rows computes them and 64
# more: 1.51x). With a window over the recomputed rows the end's state carries the
# checkpoint's cells (engine/thread/window_keep.py) and is cut back as an attention
# model's is. So the windowed families' loop runs on a copy with a real model's window.
LOOP_WINDOW = 128


@pytest.fixture(scope="module")
def real_windows(
    family_models: dict[str, FamilyModel], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The sliding-window models with a LOOP_WINDOW-token window (the same weights)."""
    folder = tmp_path_factory.mktemp("windows")
    out = {}
    for arch, model in family_models.items():
        if model.memory != "sliding-window":
            continue
        path = folder / model.path.name
        path.write_bytes(model.path.read_bytes())
        reader = gguf.GGUFReader(path, "r+")
        field = reader.fields[f"{arch}.attention.sliding_window"]
        field.parts[field.data[0]][0] = LOOP_WINDOW
        reader.data.flush()  # (the field is a view into its memory map of the file)
        out[arch] = path
    return out


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    yield
    if _LOOP or _EXTENSION:
        print("\nfamily | A then A + 20 ids: reused | agent loop, prompt tokens computed:"
              " exact / default / cold | wrong")  # fmt: skip
        for arch in (*FAMILIES, "gemma3_270m"):
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


async def agent_loop(
    warm: Engine, cold: Engine, world: World, head_tokens: int = HEAD
) -> tuple[int, int, int]:
    """3 conversations of TURNS turns, turn by turn in turns (one slot: each turn finds
    another conversation's KV in it); each turn adds the cold reply and a tool result.
    (prompt tokens computed, prompt tokens in all, replies unlike the cold engine's)."""
    head = world.ids("system", head_tokens)
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


@pytest.mark.parametrize("arch", tuple(FAMILIES))
async def test_an_agent_loop_under_exact_reuse_computes_at_most_1_5x_the_default(
    arch: str, family_models: dict[str, FamilyModel], real_windows: dict[str, Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    path = real_windows.get(arch, family_models[arch].path)
    await loop_both_ways(arch, path, tmp_path, range(VOCAB), HEAD)


async def test_an_agent_loop_on_gemma3_270m_cuts_its_turns_states_back(
    gemma3_270m: Path, tmp_path: Path
) -> None:
    """Real weights and a real window (512): a system prompt longer than it, so every
    state from the cache holds only part of its window cells, and the turns' own states
    are cut back over the recomputed rows (engine/thread/window_keep.py)."""
    await loop_both_ways("gemma3_270m", gemma3_270m, tmp_path, range(1000, 200_000), 600)


async def loop_both_ways(
    arch: str, path: Path, tmp_path: Path, vocab: range, head_tokens: int
) -> None:
    """The agent loop with exact reuse on and off, against a cold engine: the table's row."""
    cold = await start(path, n_seq_max=1, cache=None)
    try:
        figures: dict[bool, tuple[int, int, int]] = {}
        why: dict[str, int] = {}
        for exact in (True, False):
            warm = await start(path, n_seq_max=1, cache=caches(tmp_path / f"disk-{exact}"),
                               exact_reuse=exact)  # fmt: skip
            try:
                world = World(warm, cold, random.Random(0), vocab)
                figures[exact] = await agent_loop(warm, cold, world, head_tokens)
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
