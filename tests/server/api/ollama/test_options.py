"""Ollama's `options` model: Ollama's names, defaults and rules, converted once."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.api.ollama.protocol import OllamaOptions
from server.errors import BadRequest, Unsupported


def test_ollamas_defaults_and_fields_reach_the_sampler() -> None:
    params = OllamaOptions().to_sampling_params()
    assert (params.temperature, params.top_k, params.top_p, params.repeat_penalty) == (
        0.8, 40, 0.9, 1.1)  # fmt: skip
    opts = OllamaOptions.model_validate({"mirostat": 2, "mirostat_tau": 3.0, "stop": "x"})
    assert opts.to_sampling_params().mirostat == 2
    assert opts.sampling_record().stop == ("x",) and opts.sampling_record().n == 1


def test_a_negative_seed_draws_a_random_one_and_num_predict_up_to_zero_is_no_limit() -> None:
    assert OllamaOptions(seed=-1).to_sampling_params().seed is None
    assert OllamaOptions(seed=3).to_sampling_params().seed == 3
    assert OllamaOptions(num_predict=-1).max_tokens is None
    assert OllamaOptions(num_predict=0).max_tokens is None
    assert OllamaOptions(num_predict=9).max_tokens == 9


@pytest.mark.parametrize("field", ["seed", "num_predict", "num_ctx"])
@pytest.mark.parametrize("value", [True, 1.5, 2.0, "3"])
def test_counts_are_strict_integers(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as err:
        OllamaOptions.model_validate({field: value})
    assert err.value.errors()[0]["loc"][0] == field


def test_refused_and_unknown_options_name_themselves() -> None:
    with pytest.raises(Unsupported) as refused:
        OllamaOptions.model_validate({"num_gpu": 1})
    assert refused.value.param == "options.num_gpu"
    with pytest.raises(BadRequest) as unknown:
        OllamaOptions.model_validate({"bogus": 1})
    assert unknown.value.param == "options.bogus" and "unknown option" in unknown.value.message
    with pytest.raises(BadRequest) as low:
        OllamaOptions.model_validate({"num_predict": -3})
    assert low.value.param == "options.num_predict"
