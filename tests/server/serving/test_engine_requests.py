"""Request -> SamplingParams / GenerateRequest conversion."""

from __future__ import annotations

from pydantic import ValidationError

from engine.types import ModelInfo, SamplingParams
from server.api.chat.protocol import ChatCompletionRequest
from server.api.common import SamplingExtras
from server.serving.engine_requests import (
    SAMPLER_FIELDS,
    RequestSampling,
    generate_requests,
    sampling_params,
)

INFO = ModelInfo("m", "/m.gguf", 512, 512, 100, 8, 4, None, "", "", False)


def body(**fields: object) -> RequestSampling:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    ).sampling_record()


def test_unset_fields_keep_engine_defaults() -> None:
    assert sampling_params(body(), INFO) == SamplingParams()


def test_temperature_zero_is_greedy() -> None:
    assert sampling_params(body(temperature=0), INFO).greedy
    assert not sampling_params(body(temperature=0.7), INFO).greedy
    assert not sampling_params(body(temperature=0, mirostat=2), INFO).greedy


def test_logit_bias_keys_become_token_ids() -> None:
    params = sampling_params(body(logit_bias={"5": -100, "7": 2.5}), INFO)
    assert params.logit_bias == ((5, -100.0), (7, 2.5))


def test_seed_is_folded_to_32_bits() -> None:
    assert sampling_params(body(seed=-1), INFO).seed == 0xFFFFFFFF
    assert sampling_params(body(seed=2**40 + 3), INFO).seed == 3


def test_n_requests_share_the_prompt_with_successive_seeds() -> None:
    reqs = generate_requests([1, 2, 3], body(n=3, seed=5, stop="x"), INFO, max_tokens=9, logprobs=2)
    assert [r.sampling.seed for r in reqs] == [5, 6, 7]
    assert len({r.request_id for r in reqs}) == 3
    assert all(r.prompt_tokens == (1, 2, 3) and r.stop == ("x",) for r in reqs)
    assert all(r.max_tokens == 9 and r.logprobs == 2 for r in reqs)


def test_unseeded_choices_stay_unseeded() -> None:
    reqs = generate_requests([1], body(n=2), INFO, max_tokens=None, logprobs=None)
    assert [r.sampling.seed for r in reqs] == [None, None]


def test_penalty_windows_are_bounded_by_the_context() -> None:
    params = sampling_params(body(repeat_last_n=10**9, dry_penalty_last_n=-1), INFO)
    assert params.repeat_last_n == 512
    assert params.dry_penalty_last_n == -1  # the engine reads -1 as "the whole context"


def _changed(name: str, default: object) -> list[tuple[object, object]]:
    """(value sent, value expected in SamplingParams) candidates that differ from the
    engine's default, the first that the request model accepts is used."""
    if name == "logit_bias":
        return [({"5": 1.5}, ((5, 1.5),))]
    if name == "dry_sequence_breakers":
        return [(["x"], ("x",))]
    if name == "grammar":
        return [('root ::= "a"', 'root ::= "a"')]
    if isinstance(default, bool):
        return [(not default, not default)]
    if isinstance(default, int) or default is None:
        value = 7 if default is None else default + 1
        return [(value, value)]
    return [(v, v) for v in (0.5, 1.5, 0.25) if v != default]


def test_every_sampler_field_a_request_names_reaches_the_engine() -> None:
    """A request field named as the engine names it goes through with no mapping to
    edit: adding a sampling option is SamplingParams, the sampler chain, SamplingExtras."""
    defaults = SamplingParams()
    names = set(SamplingExtras.model_fields) & SAMPLER_FIELDS
    assert {"temperature", "top_k", "dry_multiplier", "xtc_threshold", "grammar"} <= names
    for name in sorted(names):
        for sent, expected in _changed(name, getattr(defaults, name)):
            try:
                record = body(**{name: sent})
            except ValidationError:
                continue
            assert getattr(sampling_params(record, INFO), name) == expected, name
            break
        else:
            raise AssertionError(f"no value of {name} to try")
