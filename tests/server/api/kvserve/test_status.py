"""GET /v1/status (fake engine): shape, recent traffic, scoping per key, bad input;
the page's static files at / and /static/."""

from __future__ import annotations

import httpx

from cache.types import CacheStats, TierStats
from engine.engine import EngineState
from server.telemetry.recent import KEEP, RecentTraffic
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

ADMIN, ALICE, BOB = "admin-key", "alice-key", "bob-key"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def chat(client: httpx.AsyncClient, key: str | None, session: str | None = None) -> None:
    body: dict[str, object] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    if session:
        body["session_id"] = session
    r = await client.post("/v1/chat/completions", json=body, headers=auth(key) if key else {})
    assert r.status_code == 200, r.text


async def test_status_without_keys_is_the_whole_server(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.get("/v1/status")
    assert r.status_code == 200
    before = r.json()
    assert before["object"] == "status" and before["scope"] == "server"
    (model,) = before["models"]
    assert model["id"] == "fake-model" and model["state"] == "loaded" and model["load"] == "startup"
    assert model["slots_total"] == 4 and len(model["slots"]) == 4 and model["queue"] == 0
    assert model["recent"]["bucket_s"] == 5 and len(model["recent"]["samples"]) == KEEP
    assert sum(s["requests"] for s in model["recent"]["samples"]) == 0

    await chat(client, None, session="s1")
    (model,) = (await client.get("/v1/status")).json()["models"]
    samples = model["recent"]["samples"]
    assert sum(s["requests"] for s in samples) == 1
    assert sum(s["generated_tokens"] for s in samples) > 0
    assert samples[-1]["ttft_s"] is not None
    assert [s["id"] for s in model["sessions"]] == ["s1"] and model["sessions_total"] == 1
    slot = model["slots"][0]
    assert slot["session"] == "s1" and slot["tokens"] > 0 and slot["busy"] is False
    assert model["cache"]["scope"] == "server" and model["cache"]["enabled"] is False


async def test_admin_sees_cache_tiers_with_hit_rates(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    stats = CacheStats({"ram": TierStats(entries=2, bytes=2048, hits=3, misses=1), "disk": TierStats()})
    fake.cache_stats = lambda: stats  # type: ignore[method-assign]
    (model,) = (await client.get("/v1/status")).json()["models"]
    tiers = model["cache"]["tiers"]
    assert tiers["ram"] == {"entries": 2, "bytes": 2048, "hits": 3, "misses": 1, "hit_rate": 0.75,
                            "evictions": 0, "errors": 0}
    assert tiers["disk"]["hit_rate"] is None and "shared" not in tiers


async def test_a_plain_key_sees_only_its_own(make_client: ClientFactory, fake: FakeEngine) -> None:
    client = make_client(fake, api_keys=(ALICE, BOB), admin_api_keys=(ADMIN,))
    await chat(client, ALICE, session="alice-1")
    await chat(client, ALICE, session="alice-2")
    await chat(client, BOB, session="bob-1")

    alice = (await client.get("/v1/status", headers=auth(ALICE))).json()
    assert alice["scope"] == "api_key"
    (model,) = alice["models"]
    assert sorted(s["id"] for s in model["sessions"]) == ["alice-1", "alice-2"]
    assert model["sessions_total"] == 2 and all("key" not in s for s in model["sessions"])
    named = [s for s in model["slots"] if s["session"]]
    assert sorted(s["session"] for s in named) == ["alice-1", "alice-2"]
    hidden = [s for s in model["slots"] if s["session"] is None]
    assert all(s["tokens"] is None and "key" not in s for s in hidden)
    assert model["cache"]["scope"] == "api_key" and "tiers" not in model["cache"]
    assert sum(s["requests"] for s in model["recent"]["samples"]) == 2  # not Bob's

    admin = (await client.get("/v1/status", headers=auth(ADMIN))).json()
    (model,) = admin["models"]
    assert admin["scope"] == "server" and model["sessions_total"] == 3
    assert {s["id"] for s in model["sessions"]} == {"alice-1", "alice-2", "bob-1"}
    assert all(s["key"] for s in model["sessions"])
    assert sorted(s["session"] for s in model["slots"] if s["session"]) == ["alice-1", "alice-2", "bob-1"]
    assert sum(s["requests"] for s in model["recent"]["samples"]) == 3


async def test_bad_input(make_client: ClientFactory, fake: FakeEngine) -> None:
    client = make_client(fake, api_keys=(ALICE,))
    r = await client.get("/v1/status")
    assert r.status_code == 401 and r.json()["error"]["type"]
    r = await client.get("/v1/status", headers=auth("wrong"))
    assert r.status_code == 401
    r = await client.get("/v1/status?model=nope", headers=auth(ALICE))
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = await client.get("/v1/status?window=5", headers=auth(ALICE))
    assert r.status_code == 400 and r.json()["error"]["param"] == "window"
    r = await client.get("/v1/status?model=fake-model", headers=auth(ALICE))
    assert r.status_code == 200 and [m["id"] for m in r.json()["models"]] == ["fake-model"]


async def test_model_states(make_client: ClientFactory) -> None:
    loading = FakeEngine(ready=False)
    client = make_client(loading)
    (model,) = (await client.get("/v1/status")).json()["models"]
    assert model["state"] == "loading" and model["load_progress"] == 0.25
    assert model["load_phase"] == "loading"
    loading.state = EngineState.UNLOADED
    (model,) = (await client.get("/v1/status")).json()["models"]
    assert model["state"] == "unloaded" and "load_progress" not in model


def test_recent_traffic_buckets_and_forgets() -> None:
    now = [1000.0]
    recent = RecentTraffic(clock=lambda: now[0])
    recent.tokens("m", "a", 10)
    recent.first_token("m", "a", 0.5)
    recent.finished("m", "a")
    recent.tokens("m", "b", 5)
    recent.tokens("other", "a", 7)
    now[0] = 1002.0  # the current bucket (1000..1005) has run 2 s
    last = recent.samples("m", None)[-1]
    assert last == {"t": 1000, "requests": 1, "generated_tokens": 15, "tokens_per_s": 7.5,
                    "ttft_s": 0.5, "ttft_max_s": 0.5}
    assert recent.samples("m", "b")[-1]["generated_tokens"] == 5
    now[0] = 1000.0 + 5 * KEEP  # five minutes on: gone
    recent.tokens("m", "a", 1)
    assert sum(s["generated_tokens"] for s in recent.samples("m", None)) == 1


async def test_the_page_and_its_files(make_client: ClientFactory, fake: FakeEngine) -> None:
    client = make_client(fake, api_keys=(ALICE,))  # the page itself needs no key
    r = await client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<script type="module" src="/static/app.js">' in r.text
    for name in ("app.js", "api.js", "chat.js", "status.js", "markdown.js", "style.css"):
        r = await client.get(f"/static/{name}")
        assert r.status_code == 200, name
    assert (await client.get("/static/nope.js")).status_code == 404
    # "/app.py" once normalized: no route, so it takes a key (server/http/key_first.py)
    assert (await client.get("/static/../app.py")).status_code == 401

