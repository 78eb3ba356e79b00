"""A gated request's JSON body is parsed once: by the model gate, whose result the route
reads (server/http/deps.py, GatedRoute); what the gate could not parse the route still answers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.requests import Request

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def route_parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies a route parsed itself (Starlette's Request.json), in order."""
    parsed: list[bytes] = []
    json = Request.json

    async def counted(self: Request) -> Any:
        parsed.append(await self.body())
        return await json(self)

    monkeypatch.setattr(Request, "json", counted)
    return parsed


async def model_id(client: httpx.AsyncClient) -> str:
    return str((await client.get("/v1/models")).json()["data"][0]["id"])


async def test_a_chat_body_is_parsed_once(
    client: httpx.AsyncClient, route_parses: list[bytes]
) -> None:
    body = {"model": await model_id(client), **CHAT}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert route_parses == []


@pytest.mark.parametrize(
    "path,extra",
    [
        ("/api/chat", {"stream": False}),
        ("/v1/messages", {"max_tokens": 2}),
        ("/v1/embeddings", None),
        ("/tokenize", None),
    ],
)
async def test_every_gated_api_reads_the_gates_parse(
    client: httpx.AsyncClient, route_parses: list[bytes], path: str, extra: dict | None
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
    assert route_parses == []


async def test_a_route_the_gate_passes_by_parses_its_own_body(
    client: httpx.AsyncClient, route_parses: list[bytes]
) -> None:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code in (200, 201), response.text
    assert route_parses == [b"{}"]


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[" * 100_000, b"null", b"[]", b'"text"', b"3"]
)
async def test_what_the_gate_cannot_parse_or_use_is_still_the_routes_400(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    """Bad JSON and a body too deep for the parser are not handed on; a parsed body that
    is no object is, and the request model refuses it."""
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_a_json_body_sent_as_text_is_read_once_as_json(
    client: httpx.AsyncClient, route_parses: list[bytes]
) -> None:
    """Every body is JSON whatever its Content-Type (server/http/middleware.py): the gate's
    parse serves such a body too."""
    body = json.dumps({"model": await model_id(client), **CHAT}).encode()
    response = await client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "text/plain"}
    )
    assert response.status_code == 200, response.text
    assert route_parses == []
