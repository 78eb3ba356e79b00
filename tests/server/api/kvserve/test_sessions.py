"""/v1/sessions, /v1/cache and session_id on the generation endpoints, over a fake engine."""

from __future__ import annotations

import asyncio

import httpx

from engine.config import SessionLimits
from server.config.tree import ModelNamesSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.helpers.waiting import until

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    if param is not None:
        assert body["param"] == param, body
    return body


async def test_session_lifecycle(client: httpx.AsyncClient) -> None:
    created = (await client.post("/v1/sessions", json={"id": "chat-1", "ttl_s": 60})).json()
    assert created["id"] == "chat-1" and created["object"] == "session"
    assert created["model"] == "fake-model" and created["ttl_s"] == 60
    assert not created["resident"] and created["tokens"] == 0
    reply = await client.post("/v1/chat/completions", json={**CHAT, "session_id": "chat-1"})
    assert reply.status_code == 200
    got = (await client.get("/v1/sessions/chat-1")).json()
    assert got["tokens"] > 0 and got["resident"] and not got["in_flight"]
    listed = (await client.get("/v1/sessions")).json()
    assert [s["id"] for s in listed["data"]] == ["chat-1"]
    forked = (await client.post("/v1/sessions/chat-1/fork", json={"id": "chat-2"})).json()
    assert forked["id"] == "chat-2" and forked["tokens"] == got["tokens"]
    deleted = (await client.delete("/v1/sessions/chat-1")).json()
    assert deleted == {"id": "chat-1", "object": "session.deleted", "deleted": True}
    error(await client.get("/v1/sessions/chat-1"), 404, "session_id")
    minted = (await client.post("/v1/sessions")).json()
    assert minted["id"].startswith("sess_")


async def test_the_header_names_the_session_and_creates_it(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x"},
                                 headers={"X-Kvserve-Session": "from-header"})
    assert response.status_code == 200
    assert (await client.get("/v1/sessions/from-header")).status_code == 200
    clash = await client.post("/v1/chat/completions", json={**CHAT, "session_id": "other"},
                              headers={"X-Kvserve-Session": "from-header"})
    error(clash, 400, "session_id")


async def test_a_foreign_session_header_is_not_kvserves_unless_configured(
    make_client: ClientFactory,
) -> None:
    """opencode sends an x-session-id of its own on every request: by default it names
    no kvserve session; `[server] session_headers` can make it one (older clients)."""
    fake = FakeEngine()
    body = {"model": "fake-model", "prompt": "x"}
    await make_client(fake).post("/v1/completions", json=body, headers={"X-Session-Id": "oc"})
    aliased = make_client(fake, session_headers=("X-Kvserve-Session", "X-Session-Id"))
    await aliased.post("/v1/completions", json=body, headers={"X-Session-Id": "oc"})
    assert [r.session_id for r in fake.submitted] == [None, "oc"]
    bad = await aliased.post("/v1/completions", json=body, headers={"X-Session-Id": "a b"})
    error(bad, 400, "X-Session-Id")


async def test_a_busy_session_is_a_hint_the_second_request_runs_unpinned(
    make_client: ClientFactory,
) -> None:
    """opencode sends its title request and its turn at once under one x-kvserve-session."""
    fake = FakeEngine(delay=0.02)
    fake.prefill_delay = 2.0  # in flight well past the requests below
    client = make_client(fake)
    first = asyncio.create_task(
        client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"})
    )
    await until(lambda: fake.running)
    error(await client.post("/v1/sessions/s/fork"), 409, "session_id")  # a fork still waits
    second = await client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"})
    assert second.status_code == 200, second.text
    assert [r.session_id for r in fake.submitted] == ["s", None]  # the second ran unpinned
    assert (await first).status_code == 200
    assert (await client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"})).status_code == 200
    assert fake.submitted[-1].session_id == "s"


async def test_a_busy_session_gets_409_when_set_to_refuse(make_client: ClientFactory) -> None:
    fake = FakeEngine(delay=0.02, sessions=SessionLimits(when_busy="refuse"))
    fake.prefill_delay = 2.0  # in flight well past the request below
    client = make_client(fake)
    first = asyncio.create_task(
        client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"})
    )
    await until(lambda: fake.running)
    body = error(await client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"}), 409)
    assert body["code"] == "session_busy"
    assert (await first).status_code == 200


async def test_sessions_belong_to_their_api_key(make_client: ClientFactory) -> None:
    client = make_client(FakeEngine(), api_keys=("key-a", "key-b"))
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    assert (await client.post("/v1/sessions", json={"id": "mine"}, headers=a)).status_code == 200
    for call in (
        client.get("/v1/sessions/mine", headers=b),
        client.delete("/v1/sessions/mine", headers=b),
        client.post("/v1/sessions/mine/fork", headers=b),
    ):
        error(await call, 404)
    assert (await client.get("/v1/sessions", headers=b)).json()["data"] == []
    assert (await client.get("/v1/sessions/mine", headers=a)).status_code == 200
    # Ids are per key: B's "mine" is B's own, answered exactly as for an unused id.
    created = await client.post("/v1/sessions", json={"id": "mine"}, headers=b)
    assert created.status_code == 200 and created.json()["tokens"] == 0
    used = await client.post("/v1/chat/completions", json={**CHAT, "session_id": "mine"}, headers=b)
    assert used.status_code == 200
    assert (await client.get("/v1/sessions/mine", headers=a)).json()["tokens"] == 0
    assert (await client.delete("/v1/sessions/mine", headers=b)).status_code == 200
    assert (await client.get("/v1/sessions/mine", headers=a)).status_code == 200


async def test_a_busy_session_cannot_be_deleted(make_client: ClientFactory) -> None:
    fake = FakeEngine(delay=0.02)
    fake.prefill_delay = 2.0  # in flight well past the delete below
    client = make_client(fake)
    first = asyncio.create_task(
        client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"})
    )
    await until(lambda: fake.running)  # a loaded CI machine took longer than 50 ms
    assert error(await client.delete("/v1/sessions/s"), 409)["code"] == "session_busy"
    assert (await first).status_code == 200
    assert (await client.delete("/v1/sessions/s")).status_code == 200


async def test_cache_salts_are_per_key_and_per_request(make_client: ClientFactory) -> None:
    fake = FakeEngine()
    client = make_client(fake, api_keys=("key-a", "key-b"))
    for key, salt in (("key-a", None), ("key-b", None), ("key-a", "project-1")):
        body = {**CHAT, "cache_salt": salt} if salt else CHAT
        await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    salts = [r.cache_salt for r in fake.submitted]
    assert len(set(salts)) == 3 and salts[2].startswith(salts[0])


async def test_session_bad_input(client: httpx.AsyncClient) -> None:
    error(await client.post("/v1/sessions", json={"id": "has space"}), 400, "id")
    error(await client.post("/v1/sessions", json={"id": "x" * 129}), 400, "id")
    error(await client.post("/v1/sessions", json={"ttl_s": -5}), 400, "ttl_s")
    error(await client.post("/v1/sessions", json={"ttl_s": 10**9}), 400, "ttl_s")
    error(await client.post("/v1/sessions", json={"ttl_s": "soon"}), 400, "ttl_s")
    error(await client.post("/v1/sessions", json={"model": "nope"}), 404, "model")
    assert (await client.post("/v1/sessions", json={"id": "dup"})).status_code == 200
    error(await client.post("/v1/sessions", json={"id": "dup"}), 409)
    error(await client.post("/v1/chat/completions", json={**CHAT, "session_id": "bad id!"}), 400)
    error(await client.post("/v1/chat/completions", json={**CHAT, "session_id": ""}), 400)
    error(await client.post("/v1/chat/completions", json={**CHAT, "session_id": "s", "n": 2}), 400, "n")
    multi = {"model": "fake-model", "prompt": ["a", "b"], "session_id": "s"}
    error(await client.post("/v1/completions", json=multi), 400, "prompt")
    error(await client.post("/v1/sessions/missing/fork"), 404)
    error(await client.delete("/v1/sessions/missing"), 404)


async def test_fork_without_a_free_slot_is_429(make_client: ClientFactory) -> None:
    fake = FakeEngine()
    client = make_client(fake)
    await client.post("/v1/sessions", json={"id": "s"})
    fake.fork_error = "every slot is busy"
    response = await client.post("/v1/sessions/s/fork")
    assert error(response, 429)["code"] == "no_free_slot"
    assert response.headers["retry-after"] == "1"


async def test_cache_endpoints(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    status = (await client.get("/v1/cache")).json()
    assert status["object"] == "list" and status["data"][0]["model"] == "fake-model"
    assert status["data"][0]["enabled"] is False
    assert (await client.delete("/v1/cache")).json() == {
        "object": "cache.purged",
        "scope": "server",  # no auth: the only caller is the admin
        "entries_removed": 0,
    }
    warmed = await client.post("/v1/cache/warm", json={"model": "fake-model", "prompt": "abc"})
    assert warmed.status_code == 200 and warmed.json()["tokens"] == 3
    assert fake.submitted[-1].max_tokens == 0  # prefilled, nothing generated
    chat = {"model": "fake-model", "messages": [{"role": "system", "content": "Be brief."}]}
    assert (await client.post("/v1/cache/warm", json=chat)).json()["tokens"] > 10


async def test_cache_warm_bad_input(make_client: ClientFactory, fake: FakeEngine) -> None:
    names = ModelNamesSection(any_with_one_model=False)  # else one model answers any name
    client = make_client(fake, settings=Settings(model_names=names))
    base = {"model": "fake-model"}
    error(await client.post("/v1/cache/warm", json=base), 400)
    error(await client.post("/v1/cache/warm", json={**base, "prompt": "a", "messages": [
        {"role": "user", "content": "b"}]}), 400)
    error(await client.post("/v1/cache/warm", json={**base, "prompt": ""}), 400, "prompt")
    error(await client.post("/v1/cache/warm", json={**base, "prompt": [-1]}), 400)
    error(await client.post("/v1/cache/warm", json={**base, "messages": []}), 400, "messages")
    error(await client.post("/v1/cache/warm", json={**base, "messages": [{"role": "x", "content": "y"}]}), 400)
    error(await client.post("/v1/cache/warm", json={"model": "nope", "prompt": "a"}), 404, "model")
    error(await client.post("/v1/cache/warm", json={**base, "prompt": "a", "cache_salt": "s" * 300}), 400)


async def test_a_key_sees_and_purges_only_its_own_cache_an_admin_all(
    make_client: ClientFactory,
) -> None:
    """Issue 9, item 5: GET/DELETE /v1/cache are per key; an admin key sees everything."""
    fake = FakeEngine()
    client = make_client(fake, api_keys=("key-a", "key-b"), admin_api_keys=("root",))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    root = {"Authorization": "Bearer root"}
    for headers in (a, a, b):
        reply = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x"},
                                  headers=headers)
        assert reply.status_code == 200
    mine = (await client.get("/v1/cache", headers=a)).json()["data"][0]
    assert mine["scope"] == "api_key" and mine["entries"] == 2 and mine["requests"] == {"cold": 2}
    assert "ram" not in mine and "disk" not in mine  # nothing server-wide
    assert (await client.get("/v1/cache", headers=root)).json()["data"][0]["scope"] == "server"
    purged = (await client.delete("/v1/cache", headers=b)).json()
    assert purged == {"object": "cache.purged", "scope": "api_key", "entries_removed": 1}
    assert (await client.get("/v1/cache", headers=a)).json()["data"][0]["entries"] == 2
    purged = (await client.delete("/v1/cache", headers=root)).json()
    assert purged["scope"] == "server" and purged["entries_removed"] == 2
    error(await client.get("/v1/cache"), 401)  # and without a key: nothing
