"""The models of other families load and decode through engine.llama (issue 27's smoke test).

The equality tests of warm and cold answers on sliding-window, recurrent and hybrid
memory build on these fixtures (tests/helpers/family_models.py); this checks only that each
model is what its fixture says it is and that 300 ids decode on one and two sequences.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from engine.llama import Batch, Context, ContextParams, Model
from tests.helpers.family_models import FAMILIES, VOCAB, FamilyModel

pytestmark = pytest.mark.model

IDS = [random.Random(1).randrange(VOCAB) for _ in range(300)]


def memory_kind(model: Model) -> str:
    """What llama.cpp says of the model's memory (llama_cpp directly until engine.llama
    probes it at load, issue 27)."""
    if llama_cpp.llama_model_is_hybrid(model.handle):
        return "hybrid"
    if llama_cpp.llama_model_is_recurrent(model.handle):
        return "recurrent"
    return "sliding-window" if llama_cpp.llama_model_n_swa(model.handle) > 0 else "attention"


def decode_ok(context: Context, batch: Batch) -> bool:
    return context.decode(batch) == 0 and bool(np.isfinite(context.logits_row(batch.size - 1)).all())


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest, family_models: dict[str, FamilyModel]) -> FamilyModel:
    return family_models[request.param]


@pytest.fixture
def loaded(family: FamilyModel) -> Iterator[Model]:
    model = Model(str(family.path))
    yield model
    model.close()


def test_family_model_is_the_architecture_it_is_named_for(family: FamilyModel, loaded: Model) -> None:
    assert loaded.meta("general.architecture") == family.arch
    assert memory_kind(loaded) == family.memory
    assert loaded.n_vocab == VOCAB


def test_family_model_decodes_one_and_two_sequences(family: FamilyModel, loaded: Model) -> None:
    context = Context(loaded, ContextParams(n_ctx=1024, n_batch=512, n_seq_max=2, n_threads=2))
    try:
        batch = Batch(512)
        batch.add(0, IDS, 0, logits_last=True)
        assert decode_ok(context, batch)
        assert context.seq_pos_max(0) == len(IDS) - 1
        context.clear()
        batch.clear()
        batch.add(0, IDS, 0, logits_last=True)  # two sequences in one batch, as the engine steps
        batch.add(1, IDS[:200], 0, logits_last=True)
        assert decode_ok(context, batch)
        assert (context.seq_pos_max(0), context.seq_pos_max(1)) == (299, 199)
    finally:
        context.close()


def test_gemma3_270m_loads_with_its_sliding_window(gemma3_270m: Path) -> None:
    model = Model(str(gemma3_270m))
    try:
        assert model.meta("general.architecture") == "gemma3"
        assert llama_cpp.llama_model_n_swa(model.handle) == 512
        assert model.add_bos and model.chat_template() is None  # the base model: no template
        ids = model.tokenize("The quick brown fox jumps over the lazy dog. " * 40,
                             add_special=True, parse_special=False)[:600]  # fmt: skip
        # one sequence of 1,024 cells: 600 ids run past the 512-token window
        context = Context(model, ContextParams(n_ctx=1024, n_batch=600, n_seq_max=1, n_threads=2))
        try:
            batch = Batch(600)
            batch.add(0, ids, 0, logits_last=True)
            assert decode_ok(context, batch)
        finally:
            context.close()
    finally:
        model.close()
