"""A request's JSON body is parsed once, by FastAPI for the route, whose model dependency
(server/http/lease.py) reads the route's own request model rather than parse it again;
what cannot be parsed is the route's 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.requests import Request

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies parsed as JSON (Starlette's Request.json), in order."""
    parsed: list[bytes] = []
    json = Request.json

    async def counted(self: Request) -> Any:
        parsed.append(await self.body())
        return await json(self)

    monkeypatch.setattr(Request, "json", counted)
    return parsed


async def model_id(client: httpx.AsyncClient) -> str:
    return str((await client.get("/v1/models")).json()["data"][0]["id"])


async def test_a_chat_body_is_parsed_once(client: httpx.AsyncClient, parses: list[bytes]) -> None:
    body = {"model": await model_id(client), **CHAT}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert parses == [json.dumps(body, separators=(",", ":")).encode()]


@pytest.mark.parametrize(
    "path,extra",
    [
        ("/api/chat", {"stream": False}),
        ("/v1/messages", {"max_tokens": 2}),
        ("/v1/embeddings", None),
        ("/tokenize", None),
    ],
)
async def test_every_api_parses_its_body_once(
    client: httpx.AsyncClient, parses: list[bytes], path: str, extra: dict | None
) -> None:
    model = await model_id(client)
    if path == "/v1/embeddings":
        body: dict[str, Any] = {"model": model, "input": "hello"}
    elif path == "/tokenize":
        body = {"content": "hello"}
    else:
        body = {"model": model, **CHAT, **(extra or {})}
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert len(parses) == 1 and json.loads(parses[0]) == body


async def test_a_route_that_needs_no_model_parses_its_body_once(
    client: httpx.AsyncClient, parses: list[bytes]
) -> None:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code in (200, 201), response.text
    assert parses == [b"{}"]


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[" * 100_000, b"null", b"[]", b'"text"', b"3"]
)
async def test_what_cannot_be_parsed_or_used_is_the_routes_400(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    """Bad JSON, a body too deep for the parser, and a parsed body that is no object (the
    request model refuses it)."""
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_a_json_body_sent_as_text_is_read_once_as_json(
    client: httpx.AsyncClient, parses: list[bytes]
) -> None:
    """Every body is JSON whatever its Content-Type (server/http/middleware.py), parsed
    once as any other."""
    body = json.dumps({"model": await model_id(client), **CHAT}).encode()
    response = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "text/plain"}
    )
    assert response.status_code == 200, response.text
    assert parses == [body]
