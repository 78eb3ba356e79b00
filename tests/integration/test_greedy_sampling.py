"""Greedy sampling without llama.cpp's candidate array picks what llama.cpp's chain picks,
and the logits view kept between steps reads the row llama.cpp names (real model)."""

from __future__ import annotations

import llama_cpp as C
import numpy as np
import pytest

from engine.llama.context import Batch, Context, ContextParams
from engine.llama.model import Model
from engine.llama.sampler import Sampler
from engine.types import SamplingParams
from server.config.tree import default_model_path

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> Model:
    m = Model(str(default_model_path()))
    yield m
    m.close()


def test_greedy_picks_what_the_chain_picks(model: Model) -> None:
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=64, n_seq_max=1, n_threads=2))
    batch = Batch(64)
    prompt = model.tokenize("The capital of France is", add_special=True, parse_special=False)
    batch.add(0, prompt, 0, True)
    assert ctx.decode(batch) == 0
    top = int(np.argmax(ctx.logits_row(len(prompt) - 1)))
    cases = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, ignore_eos=True),
        # the favourite forbidden, token 7 listed twice (llama.cpp adds both: +40, its
        # pick then; the last alone would bury it), an id past the vocabulary left out
        SamplingParams(temperature=0.0, logit_bias=((top, float("-inf")), (7, 100.0),
                                                     (7, -60.0), (model.n_vocab + 5, 9.0))),
    ]  # fmt: skip
    samplers = [Sampler(model, p, 1, 512) for p in cases]
    try:
        assert all(s._greedy_bias is not None for s in samplers)
        pos, row = len(prompt), len(prompt) - 1
        for _ in range(12):
            before = ctx.logits_row(row).copy()
            for s in samplers:
                assert s.sample(ctx, row) == C.llama_sampler_sample(s.handle, ctx.handle, row)
                assert np.array_equal(ctx.logits_row(row), before)  # a bias taken back
            assert samplers[2].sample(ctx, row) == 7
            batch.clear()
            row = batch.add(0, [samplers[0].sample(ctx, row)], pos, True)
            pos += 1
            assert ctx.decode(batch) == 0
    finally:
        for s in samplers:
            s.close()
        ctx.close()


def test_chains_with_state_keep_llama_sampling(model: Model) -> None:
    for params in (
        SamplingParams(temperature=0.0, repeat_penalty=1.1),
        SamplingParams(temperature=0.0, dry_multiplier=0.8),
        SamplingParams(temperature=0.7),
    ):
        sampler = Sampler(model, params, 1, 512)
        assert sampler._greedy_bias is None, params
        sampler.close()


def test_logits_view_follows_the_row(model: Model) -> None:
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=64, n_seq_max=2, n_threads=2))
    batch = Batch(64)

    def tokens(text: str) -> list[int]:
        return model.tokenize(text, add_special=True, parse_special=False)

    try:
        rows = [batch.add(0, tokens("One two three"), 0, True)]
        rows.append(batch.add(1, tokens("Paris is in"), 0, True))
        assert ctx.decode(batch) == 0
        for _ in range(2):  # each row, then each again: the kept view must not stick
            for row in rows:
                fresh = C.llama_get_logits_ith(ctx.handle, row)
                expected = np.ctypeslib.as_array(fresh, shape=(model.n_vocab,))
                assert np.array_equal(ctx.logits_row(row), expected)
        assert not np.array_equal(ctx.logits_row(rows[0]), ctx.logits_row(rows[1]))
        with pytest.raises(ValueError):
            ctx.logits_row(batch.size + 3)  # a row with no logits: an error, not a read
    finally:
        ctx.close()
