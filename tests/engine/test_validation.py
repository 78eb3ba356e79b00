"""Request checks only the engine can make (its model and its context), without a model."""

from __future__ import annotations

import dataclasses

import pytest

from engine.loop.validation import validate
from engine.types import GenerateRequest, InvalidRequestError, ModelInfo, SamplingParams

INFO = ModelInfo("m", "/m.gguf", 512, 512, 100, 8, 4, None, "", "", False)


def test_speculative_is_refused_where_it_would_change_the_tokens() -> None:
    no_flash = dataclasses.replace(INFO, speculative_ok=False)
    with pytest.raises(InvalidRequestError) as caught:
        validate(GenerateRequest("r", (1, 2, 3), speculative=True), no_flash)
    assert caught.value.param == "speculative" and "flash_attn" in str(caught.value)
    # Not asking for it, or asking a model with flash attention, is fine.
    validate(GenerateRequest("r", (1, 2, 3), speculative=False), no_flash)
    validate(GenerateRequest("r", (1, 2, 3)), no_flash)
    validate(GenerateRequest("r", (1, 2, 3), speculative=True), INFO)


def test_a_logit_bias_token_outside_the_vocabulary_is_refused() -> None:
    # Moved from tests/server/http/test_sampling.py: the range is checked here only.
    sampling = SamplingParams(logit_bias=((100, 1.0),))
    with pytest.raises(InvalidRequestError) as err:
        validate(GenerateRequest("r", (1, 2, 3), sampling=sampling), INFO)
    assert err.value.param == "logit_bias"
    validate(GenerateRequest("r", (1, 2, 3), sampling=SamplingParams(logit_bias=((99, 1.0),))), INFO)
