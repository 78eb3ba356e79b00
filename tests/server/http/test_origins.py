"""Browsers of other sites may not drive the server (issue 28, item 2): a state-changing
request with a foreign `Origin` gets 403 in its API's shape, a foreign `Host` on a
loopback connection (DNS rebinding) gets 403; the server's own page, the configured CORS
origins and clients that are not browsers go on as before. And every route reads its
body as JSON whatever the Content-Type (curl's form default included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.client import EngineState
from server.app import create_app
from server.config.tree import AuthSection, HubSection, ModelSection, ServerSection, Settings
from tests.e2e.test_nginx_affinity import NGINX, start_nginx
from tests.fakes import FakeEngine
from tests.helpers.threaded_server import serving

LOOPBACK = "http://127.0.0.1:8080"  # the URL (and so the ASGI scope's server) of the tests
FOREIGN = "http://evil.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # curl -d's default
TEXT = {"Content-Type": "text/plain"}  # what a no-CORS fetch() may send unpreflighted

Factory = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Factory]:
    clients: list[httpx.AsyncClient] = []

    def build(
        *,
        base_url: str = LOOPBACK,
        keys: tuple[str, ...] = (),
        admin_keys: tuple[str, ...] = (),
        **server: Any,
    ) -> httpx.AsyncClient:
        settings = Settings(
            server=ServerSection(**server),
            models=(ModelSection(id="fake-model"),),
            hub=HubSection(cache_dir=str(tmp_path / "hf")),
            auth=AuthSection(api_keys=keys, admin_api_keys=admin_keys),
        )
        app = create_app(settings, FakeEngine())
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)
        client.app = app  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()
        for model in client.app.state.models:  # type: ignore[attr-defined]
            model.engine.close()


async def _copied(client: httpx.AsyncClient) -> bool:
    """Whether COPY's name `mine` now serves."""
    return (await client.get("/v1/models/mine")).status_code == 200


def _engine(client: httpx.AsyncClient) -> Any:
    return client.app.state.models.default.engine  # type: ignore[attr-defined]


# Each management request as a page may send it (no CORS: text/plain or no body at all).
COPY = ("/api/copy", json.dumps({"source": "fake-model", "destination": "mine"}))
PULL = ("/api/pull", json.dumps({"model": "llama3.2"}))
UNLOAD = ("/v1/models/fake-model/unload", "")


@pytest.mark.parametrize("path,body", [COPY, PULL, UNLOAD])
async def test_a_page_of_another_origin_is_refused_and_changes_nothing(
    make: Factory, path: str, body: str
) -> None:
    client = make()
    r = await client.post(path, content=body, headers={**TEXT, "Origin": FOREIGN})
    assert r.status_code == 403, r.text
    message = r.json()["error"]
    if path.startswith("/api/"):  # Ollama's shape: one string
        assert isinstance(message, str) and "http://evil.example" in message
    else:  # OpenAI's
        assert message["code"] == "origin_not_allowed" and "evil.example" in message["message"]
    assert not await _copied(client)
    assert _engine(client).state is EngineState.READY  # not unloaded


@pytest.mark.parametrize(
    "origin,cors",
    [
        (LOOPBACK, ()),  # the server's own page
        ("http://127.0.0.1:8080/", ()),  # (a trailing slash is the same origin)
        ("https://app.example:3000", ("https://app.example:3000",)),  # a CORS origin
        (FOREIGN, ("*",)),  # CORS open to every origin
    ],
)
async def test_the_servers_own_origin_and_cors_origins_pass(
    make: Factory, origin: str, cors: tuple[str, ...]
) -> None:
    client = make(cors_origins=cors)
    r = await client.post(COPY[0], content=COPY[1], headers={**TEXT, "Origin": origin})
    assert r.status_code == 200, r.text
    assert await _copied(client)
    r = await client.post(PULL[0], content=PULL[1], headers={**TEXT, "Origin": origin})
    assert r.status_code == 400 and "only Hugging Face" in r.json()["error"]  # the route's answer
    r = await client.post(UNLOAD[0], headers={"Origin": origin})
    assert r.status_code == 200, r.text
    assert _engine(client).state is EngineState.UNLOADED


async def test_clients_that_are_not_browsers_are_unaffected(make: Factory) -> None:
    client = make()
    assert (await client.post(COPY[0], content=COPY[1], headers=TEXT)).status_code == 200
    assert await _copied(client)
    assert (await client.post(UNLOAD[0])).status_code == 200
    # Reads are not state-changing: a foreign Origin on a GET is CORS's business.
    assert (await client.get("/api/tags", headers={"Origin": FOREIGN})).status_code == 200


@pytest.mark.parametrize(
    "origin",
    [
        "null",  # a sandboxed frame, a file:// page
        "http://127.0.0.1:9999",  # another port of the same host is another origin
        "http://localhost:8080",  # another name for the same server, another origin
        "https://app.example:3000.evil.example",
    ],
)
async def test_other_origins_are_foreign(make: Factory, origin: str) -> None:
    client = make(cors_origins=("https://app.example:3000",))
    r = await client.post(COPY[0], content=COPY[1], headers={**TEXT, "Origin": origin})
    assert r.status_code == 403, r.text


async def test_each_api_answers_the_refusal_in_its_own_shape(make: Factory) -> None:
    client = make()
    foreign = {"Origin": FOREIGN, "Content-Type": "application/json"}
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post("/v1/messages", json={**chat, "max_tokens": 5}, headers=foreign)
    assert r.status_code == 403
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "permission_error"
    r = await client.post("/v1/chat/completions", json=chat, headers=foreign)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = await client.request("DELETE", "/api/delete", json={"model": "x"}, headers=foreign)
    assert r.status_code == 403 and isinstance(r.json()["error"], str)
    r = await client.request("DELETE", "/v1/sessions/s1", headers={"Origin": FOREIGN})
    assert r.status_code == 403


async def test_the_origin_check_and_the_api_key_are_both_needed(make: Factory) -> None:
    # An admin key: unloading is model management (server/http/management.py).
    client = make(admin_keys=("k",), cors_origins=("https://app.example",))
    key = {"Authorization": "Bearer k"}
    r = await client.post(UNLOAD[0], headers={**key, "Origin": FOREIGN})
    assert r.status_code == 403  # a key does not make a foreign page welcome
    r = await client.post(UNLOAD[0], headers={"Origin": "https://app.example"})
    assert r.status_code == 401  # nor does an allowed origin stand for a key
    r = await client.post(UNLOAD[0], headers={**key, "Origin": "https://app.example"})
    assert r.status_code == 200


async def test_cors_preflight_still_answers_for_the_configured_origins(make: Factory) -> None:
    client = make(cors_origins=("https://app.example",))
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    r = await client.options("/api/copy", headers={**ask, "Origin": "https://app.example"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    r = await client.options("/api/copy", headers={**ask, "Origin": FOREIGN})
    assert "access-control-allow-origin" not in r.headers


# -- Host (DNS rebinding) --------------------------------------------------------------


async def test_a_rebound_name_is_refused_on_a_loopback_connection(make: Factory) -> None:
    client = make()
    rebound = {"Host": "evil.example:8080"}
    r = await client.get("/v1/models", headers=rebound)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    # The page's origin is the rebound name: its Origin matches its Host, and only the
    # Host check stands between it and the management routes.
    same = {**rebound, **TEXT, "Origin": "http://evil.example:8080"}
    r = await client.post(COPY[0], content=COPY[1], headers=same)
    assert r.status_code == 403 and "allowed_hosts" in r.json()["error"]
    assert not await _copied(client)
    r = await client.post("/v1/messages", json={}, headers=rebound)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "app.localhost:8080",
             "[::1]:8080", "10.1.2.3:8080"]  # fmt: skip
)
async def test_loopback_names_and_addresses_pass(make: Factory, host: str) -> None:
    client = make()
    assert (await client.get("/v1/models", headers={"Host": host})).status_code == 200


async def test_allowed_hosts_extend_and_star_lifts_the_host_check(make: Factory) -> None:
    client = make(allowed_hosts=("box.internal",))
    assert (await client.get("/v1/models", headers={"Host": "box.internal:8080"})).is_success
    assert (await client.get("/v1/models", headers={"Host": "evil.example"})).status_code == 403
    anything = make(allowed_hosts=("*",))
    assert (await anything.get("/v1/models", headers={"Host": "evil.example"})).is_success


async def test_a_connection_from_the_network_is_held_to_allowed_hosts_only_when_set(
    make: Factory,
) -> None:
    # Not a loopback arrival (the ASGI scope's server is the URL's host): any Host ...
    network = make(base_url="http://192.0.2.10:8080")
    assert (await network.get("/v1/models", headers={"Host": "kvserve.example"})).is_success
    # ... unless the operator listed the names.
    listed = make(base_url="http://192.0.2.10:8080", allowed_hosts=("kvserve.example",))
    assert (await listed.get("/v1/models", headers={"Host": "kvserve.example"})).is_success
    assert (await listed.get("/v1/models", headers={"Host": "evil.example"})).status_code == 403


async def _raw(port: int, head: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


async def test_real_uvicorn_on_loopback_refuses_a_rebound_host() -> None:
    with serving(FakeEngine()) as url:
        port = int(url.rsplit(":", 1)[1])
        head = await _raw(port, "GET /v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403")
        head = await _raw(port, f"GET /v1/models HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_behind_the_deploy_nginx_the_page_is_its_own_origin(tmp_path: Path) -> None:
    """deploy/'s nginx forwards the Host as the browser sent it, port included (`$host`
    dropped the port: the page's own POSTs were 403), so the replica counts the page's
    Origin as its own; another site's still gets 403, a rebound name too."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi."}]}
    with serving(FakeEngine()) as replica, contextlib.ExitStack() as stack:
        url = start_nginx(tmp_path, [replica, replica], stack)
        with httpx.Client(base_url=url, timeout=30) as http:
            own = http.post("/v1/chat/completions", json=body, headers={"Origin": url})
            assert own.status_code == 200, own.text
            other = http.post("/v1/chat/completions", json=body, headers={"Origin": FOREIGN})
            assert other.status_code == 403
            assert http.get("/v1/models", headers={"Host": "evil.example"}).status_code == 403


# -- the page at / ---------------------------------------------------------------------


async def test_the_page_and_its_own_requests_pass(make: Factory) -> None:
    client = make()
    page = await client.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert (await client.get("/static/api.js")).status_code == 200
    own = {"Origin": LOOPBACK}  # what the page's fetch() sends
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "session_id": "web-1"}  # fmt: skip
    r = await client.post("/v1/chat/completions", json=chat, headers=own)
    assert r.status_code == 200 and "[DONE]" in r.text
    assert (await client.delete("/v1/sessions/web-1", headers=own)).status_code == 200


# -- bodies are JSON whatever their Content-Type ----------------------------------------

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
BODIES = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": "fake-model", "prompt": "hi", "max_tokens": 3}),
    ("/v1/messages", {**CHAT, "max_tokens": 3}),
    ("/v1/messages/count_tokens", {"model": "fake-model", "messages": CHAT["messages"]}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "max_output_tokens": 3}),
    ("/api/generate", {"model": "fake-model", "prompt": "hi", "stream": False}),
    ("/api/chat", {"model": "fake-model", "messages": CHAT["messages"], "stream": False}),
    ("/api/show", {"model": "fake-model"}),
    ("/tokenize", {"content": "hi"}),
    ("/v1/sessions", {"id": "s-form"}),
    ("/api/copy", {"source": "fake-model", "destination": "c"}),
]


@pytest.mark.parametrize("path,body", BODIES, ids=[p for p, _ in BODIES])
@pytest.mark.parametrize("content_type", [FORM, TEXT, {}], ids=["form", "text", "none"])
async def test_a_json_body_is_read_whatever_its_content_type(
    make: Factory, path: str, body: dict[str, Any], content_type: dict[str, str]
) -> None:
    client = make()
    r = await client.post(path, content=json.dumps(body), headers=content_type)
    assert r.status_code == 200, r.text


async def test_a_form_body_that_is_not_json_is_a_400_in_the_apis_shape(make: Factory) -> None:
    client = make()
    r = await client.post("/v1/chat/completions", content="a=1&b=2", headers=FORM)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "the request body is not valid JSON"
    )
    r = await client.post("/api/generate", content="a=1&b=2", headers=FORM)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
