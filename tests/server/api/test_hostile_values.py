"""Regression tests for values that used to get past validation (found by the
reliability suite): lone UTF-16 surrogates (500 from the tokenizer) and the NaN /
Infinity literals Python's json accepts (reached the sampler as NaN)."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeEngine

HEADERS = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",  # the same surrogate sent as raw (invalid) UTF-8
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
            "messages[0].content",
        ),
        ("/v1/completions", b'{"model": "fake-model", "prompt": ["ok", "\\udfff"]}', "prompt"),
        ("/v1/embeddings", b'{"model": "fake-model", "input": "\\ud800"}', "input"),
        ("/tokenize", b'{"content": "\\ud800"}', "content"),
        (
            "/v1/chat/completions",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],'
            b' "chat_template_kwargs": {"x": [["\\udc00"]]}}',
            "chat_template_kwargs",
        ),
    ],
)
async def test_lone_surrogates_are_refused(
    client: httpx.AsyncClient, fake: FakeEngine, path: str, body: bytes, param: str
) -> None:
    response = await client.post(path, content=body, headers=HEADERS)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert not fake.submitted


async def test_a_surrogate_pair_is_a_valid_character(client: httpx.AsyncClient) -> None:
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    response = await client.post("/v1/chat/completions", content=body, headers=HEADERS)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["top_n_sigma", "dry_multiplier", "mirostat_tau", "temperature"])
async def test_non_finite_numbers_are_refused(
    client: httpx.AsyncClient, fake: FakeEngine, field: str, literal: str
) -> None:
    body = f'{{"model": "fake-model", "prompt": "hi", "{field}": {literal}}}'.encode()
    response = await client.post("/v1/completions", content=body, headers=HEADERS)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field
    assert not fake.submitted


@pytest.mark.parametrize(
    ("extra", "param", "reason"),
    [
        ({"prompt": []}, "prompt", "at least 1 item"),
        ({"prompt": [""]}, "prompt", "at least 1 character"),
        ({"prompt": [[]]}, "prompt", "at least 1 item"),
        ({"prompt": "x", "stop": ""}, "stop", "at least 1 character"),
        ({"prompt": "x", "stop": ["s"] * 17}, "stop", "at most 16 items"),
    ],
)
async def test_union_fields_report_the_reason_not_the_first_branch(
    client: httpx.AsyncClient, extra: dict, param: str, reason: str
) -> None:
    """The schema now says prompts and stop strings are non-empty (so generated requests
    are valid more often); a value that fits no branch of such a union names why."""
    response = await client.post("/v1/completions", json={"model": "fake-model", **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and reason in error["message"], error


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_bad_logit_bias_key_is_a_400_on_every_endpoint(
    client: httpx.AsyncClient, path: str
) -> None:
    """Regression: completions translated the request inside its engine-error handler,
    which turned this 400 into a 500."""
    body = {"model": "fake-model", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    response = await client.post(path, json={**body, "logit_bias": {"not-a-token": 1}})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "logit_bias"


async def test_a_body_that_is_not_an_object_is_named_as_such(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json=[1, 2])
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("invalid request body:")
