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
