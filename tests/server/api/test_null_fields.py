"""An explicit null for any optional field means "absent", on every route (issue 10,
item 5), as OpenAI and its SDKs treat it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from server.api.chat.protocol import ChatCompletionRequest
from server.api.chat.template import ApplyTemplateRequest
from server.api.completions.protocol import CompletionRequest
from server.api.embeddings.protocol import EmbeddingRequest
from server.api.kvserve.protocol import DetokenizeRequest, TokenizeRequest
from tests.server.api.test_openai_api import MODEL, assert_error

BASES: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
    ("/v1/chat/completions", ChatCompletionRequest,
     {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    ("/v1/completions", CompletionRequest, {"model": MODEL, "prompt": "Hi", "max_tokens": 4}),
    ("/v1/embeddings", EmbeddingRequest, {"model": MODEL, "input": "Hi"}),
    ("/tokenize", TokenizeRequest, {"content": "Hi"}),
    ("/tokenize", TokenizeRequest, {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/detokenize", DetokenizeRequest, {"tokens": [72]}),
    ("/apply-template", ApplyTemplateRequest, {"messages": [{"role": "user", "content": "Hi"}]}),
]  # fmt: skip
# /tokenize takes one of two fields: the one a base sends is required there.
ONE_OF = {"content", "messages"}


def optional_fields(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items() if not f.is_required()]


CASES = [
    (path, base, name)
    for path, model, base in BASES
    for name in optional_fields(model)
    if not (path == "/tokenize" and name in ONE_OF and name in base)
]


@pytest.mark.parametrize(("path", "base", "name"), CASES, ids=[f"{p}:{n}:{sorted(b)[0]}" for p, b, n in CASES])
async def test_null_optional_field_is_absent(
    client: httpx.AsyncClient, path: str, base: dict[str, Any], name: str
) -> None:
    r = await client.post(path, json={**base, name: None})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "nested",
    [
        {"stream": True, "stream_options": {"include_usage": None}},
        {"messages": [{"role": "user", "content": "Hi", "name": None, "tool_calls": None,
                       "tool_call_id": None}]},
        {"tools": [{"type": "function", "function": {"name": "f", "description": None,
                                                     "parameters": None, "strict": None}}]},
        {"response_format": {"type": "json_object", "json_schema": None}},
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": None, "strict": None,
                                             "description": None}}},
    ],
)  # fmt: skip
async def test_null_nested_fields_are_absent(
    client: httpx.AsyncClient, nested: dict[str, Any]
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    r = await client.post("/v1/chat/completions", json={**body, **nested})
    assert r.status_code == 200, r.text


async def test_null_required_field_is_missing(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": None})
    assert_error(r, 400, "messages")
