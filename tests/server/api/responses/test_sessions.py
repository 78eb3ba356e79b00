"""Stored responses meet sessions, keys and replicas (issue 17, items 2, 4 and 5): the
X-Kvserve-Session header, a chain's own session pool, per-key bounds, and a chain continued
on another replica through the shared Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import CacheConfig
from engine.config import SessionLimits
from engine.types import SessionPool
from server.api.responses.store import ResponseStore, Stored
from server.config.tree import AuthSection, ResponsesSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.helpers.redis_process import Redis, running_redis
from tests.server.api.test_openai_api import MODEL, assert_error

Build = Callable[..., httpx.AsyncClient]
K1 = {"Authorization": "Bearer k1"}
K2 = {"Authorization": "Bearer k2"}


@pytest.fixture
async def build(make_client: ClientFactory) -> AsyncIterator[Build]:
    """An app over `engine` with the given [responses] and [cache] settings, keys k1, k2."""
    apps: list[Any] = []

    def make(engine: Any, *, max_stored: int = 1000, shared_url: str = "") -> httpx.AsyncClient:
        settings = Settings(
            responses=ResponsesSection(max_stored=max_stored),
            cache=CacheConfig(disk_dir="", shared_url=shared_url, shared_retry_s=0.2),
            auth=AuthSection(api_keys=("k1", "k2")),
        )
        client = make_client(engine, settings=settings)
        apps.append(client._transport.app)  # type: ignore[attr-defined]
        return client

    yield make
    for app in apps:  # (the lifespan, which closes the store, does not run here)
        app.state.responses.close()


async def respond(client: httpx.AsyncClient, headers: dict[str, str] = K1, **extra: Any) -> Any:
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "Hi", **extra},
                          headers=headers)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def sessions(engine: FakeEngine, pool: SessionPool) -> set[str]:
    return {s.id for s in engine.sessions._sessions.values() if s.pool is pool}


def chains(engine: FakeEngine) -> set[str]:
    return sessions(engine, SessionPool.CHAIN)


async def test_the_session_header_names_the_chains_session(build: Build) -> None:
    """Item 2: the header nginx routes on was a 400 about a field nobody sent."""
    fake = FakeEngine(n_ctx=8192)
    client = build(fake)
    first = await respond(client, {**K1, "X-Kvserve-Session": "conv-7"})
    assert fake.submitted[-1].session_id == "conv-7"
    assert fake.submitted[-1].session_pool is SessionPool.NAMED  # the client's own session
    await respond(client, {**K1, "X-Kvserve-Session": "conv-7"}, input="more",
                  previous_response_id=first["id"])  # fmt: skip
    assert fake.submitted[-1].session_id == "conv-7"
    await client.delete(f"/v1/responses/{first['id']}", headers=K1)
    assert sessions(fake, SessionPool.NAMED) == {"conv-7"}  # it outlives the response
    assert chains(fake) == set()


async def test_stored_responses_leave_the_key_its_sessions(build: Build) -> None:
    """Item 4: 260 stored responses left a key no room for the sessions it names."""
    fake = FakeEngine(n_ctx=8192, sessions=SessionLimits(max_sessions=6, max_sessions_per_key=4))
    client = build(fake)
    for _ in range(10):
        await respond(client)
    for i in range(4):  # the key's whole quota of named sessions is still there
        r = await client.post(
            "/v1/chat/completions",
            headers=K1,
            json={
                "model": MODEL,
                "session_id": f"s{i}",
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        assert r.status_code == 200, r.text
    r = await client.post(
        "/v1/chat/completions",
        headers=K2,
        json={"model": MODEL, "session_id": "b", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 200, r.text  # and the global bound too, for the other key
    assert len(chains(fake)) == 4  # chains have a pool of their own, bounded the same way
    named = sessions(fake, SessionPool.NAMED)
    assert named == {"s0", "s1", "s2", "s3", "b"}  # no chain pushed a named session out


async def test_deleting_or_evicting_a_response_frees_its_session(build: Build) -> None:
    """Item 4: a dropped response's chain session ends with it (unless a stored
    response still continues on it)."""
    fake = FakeEngine(n_ctx=8192)
    client = build(fake, max_stored=2)
    one = await respond(client)
    two = await respond(client, previous_response_id=one["id"])  # the same chain session
    (chain,) = chains(fake)
    assert fake.submitted[-1].session_id == chain
    await client.delete(f"/v1/responses/{one['id']}", headers=K1)
    assert chains(fake) == {chain}  # `two` still continues on it
    await client.delete(f"/v1/responses/{two['id']}", headers=K1)
    assert chains(fake) == set()
    first = await respond(client)
    first_chain = fake.submitted[-1].session_id
    await respond(client)
    await respond(client)  # pushes `first` out (two per key)
    assert_error(await client.get(f"/v1/responses/{first['id']}", headers=K1), 404)
    assert first_chain not in chains(fake) and len(chains(fake)) == 2


async def test_one_keys_responses_do_not_push_out_anothers(build: Build) -> None:
    """Item 5: the store dropped the globally oldest entry, whoever owned it."""
    client = build(FakeEngine(n_ctx=8192), max_stored=2)
    mine = await respond(client, K1)
    for _ in range(5):
        await respond(client, K2)
    got = await client.get(f"/v1/responses/{mine['id']}", headers=K1)
    assert got.status_code == 200, got.text


async def test_store_bounds_are_per_key_and_by_age() -> None:
    now = [0.0]
    released: list[tuple[str, str]] = []
    store = ResponseStore(2, 10, lambda: now[0], release=lambda t, s: released.append((t, s)))
    await store.put(Stored("b", {"id": "b0"}, [], "chain-b", SessionPool.CHAIN))
    for i in range(3):
        await store.put(Stored("a", {"id": f"a{i}"}, [], f"chain-{i}", SessionPool.CHAIN))
    assert len(store) == 3 and released == [("a", "chain-0")]
    assert (await store.get("b", "b0")).session_id == "chain-b"
    with pytest.raises(Exception, match="not found"):
        await store.get("a", "a0")
    with pytest.raises(Exception, match="not found"):
        await store.get("a", "b0")  # another key's: as if unknown
    now[0] = 10.5
    assert len(store) == 0
    assert sorted(released) == [("a", "chain-0"), ("a", "chain-1"), ("a", "chain-2"),
                                ("b", "chain-b")]  # fmt: skip


# -- replicas sharing one Redis ----------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Redis]:
    with running_redis(tmp_path) as server:
        yield server


async def test_a_chain_continues_on_another_replica(build: Build, redis_server: Redis) -> None:
    """Item 2: stored responses lived in one replica's memory: `previous_response_id`
    at another replica was a 404. Now they live in the shared Redis."""
    engines = [FakeEngine(n_ctx=8192), FakeEngine(n_ctx=8192)]
    one, two = (build(e, max_stored=3, shared_url=redis_server.url) for e in engines)
    first = await respond(one, input="the first question")
    got = await two.get(f"/v1/responses/{first['id']}", headers=K1)
    assert got.status_code == 200 and got.json() == first
    assert_error(await two.get(f"/v1/responses/{first['id']}", headers=K2), 404)
    second = await respond(two, input="the second", previous_response_id=first["id"])
    prompt = bytes(engines[1].submitted[-1].prompt_tokens).decode()
    assert "the first question" in prompt and "the second" in prompt
    # the same chain session, now on replica two (its KV comes from the shared cache)
    assert engines[1].submitted[-1].session_id == engines[0].submitted[-1].session_id
    assert engines[1].submitted[-1].session_pool is SessionPool.CHAIN
    chain = engines[1].submitted[-1].session_id
    assert (await two.delete(f"/v1/responses/{first['id']}", headers=K1)).status_code == 200
    assert chain in chains(engines[1])  # `second` still continues on it
    deleted = await two.delete(f"/v1/responses/{second['id']}", headers=K1)
    assert deleted.status_code == 200, deleted.text
    assert chain not in chains(engines[1])
    assert_error(await one.get(f"/v1/responses/{second['id']}", headers=K1), 404)
    # the per-key bound holds across replicas: another key's entries are not pushed out
    theirs = await respond(two, K2)
    mine = [await respond(client, K1) for client in (one, two, one, two)]
    assert (await one.get(f"/v1/responses/{theirs['id']}", headers=K2)).status_code == 200
    assert_error(await two.get(f"/v1/responses/{mine[0]['id']}", headers=K1), 404)
    assert (await two.get(f"/v1/responses/{mine[1]['id']}", headers=K1)).status_code == 200


async def test_a_down_redis_keeps_responses_on_the_replica(
    build: Build, redis_server: Redis
) -> None:
    fake = FakeEngine(n_ctx=8192)
    client = build(fake, shared_url=redis_server.url)
    redis_server.stop()
    first = await respond(client)
    second = await respond(client, previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    assert (await client.get(f"/v1/responses/{first['id']}", headers=K1)).status_code == 200
