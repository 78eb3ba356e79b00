"""A tenant's share of the prefix cache: what its GET /v1/cache shows and its DELETE
removes, whatever adapters its prefixes were computed under."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx

from cache import PrefixCache
from engine.types import GenerateRequest, LoraAdapter
from server.app import create_app
from server.config.tree import AuthSection, LoraSection, ModelSection, Settings
from server.http.deps import Caller
from tests.cache.util import config, saved
from tests.fakes import FakeEngine

ADAPTER = LoraAdapter("pirate", "/x/p.gguf", 0.0)
A, B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}


def test_a_caller_owns_its_lora_salted_prefixes_and_no_one_else_does() -> None:
    """Issue 17, item 8: `prefix_salt` appends the adapter set to the caller's salt."""
    me, other = Caller("a" * 16, None), Caller("b" * 16, None)
    for cache_salt in (None, "mine"):
        request = GenerateRequest(
            "r", (1,), cache_salt=me.salt(cache_salt), lora=(("pirate", 0.5),)
        )
        assert me.owns(request.prefix_salt)
        assert not other.owns(request.prefix_salt)
    # another key cannot make a salt of its own look like ours
    sneaky = GenerateRequest("r", (1,), cache_salt=other.salt("\x00lora:" + me.tenant))
    assert not me.owns(sneaky.prefix_salt)


def test_a_tenant_purge_removes_its_lora_prefixes_from_disk(tmp_path: Path) -> None:
    """Purged, a LoRA-salted prefix is not found again after a restart."""
    me = Caller("a" * 16, None)
    salt = GenerateRequest("r", (1,), cache_salt=me.salt(None), lora=(("x", 1.0),)).prefix_salt
    cache = PrefixCache(config(disk_dir=str(tmp_path)), "ns")
    saved(cache, [1, 2, 3, 4, 5], salt=salt)
    assert cache.entries_of(me.owns) == (1, 5)
    assert cache.purge_where(me.owns) == 1
    cache.close(timeout=10)
    restarted = PrefixCache(config(disk_dir=str(tmp_path)), "ns")
    try:
        assert restarted.lookup([1, 2, 3, 4, 5], salt) is None
    finally:
        restarted.close(timeout=10)


async def test_get_and_delete_cache_see_a_keys_lora_prefixes() -> None:
    fake = FakeEngine()
    fake._info = dataclasses.replace(fake.info, loras=(ADAPTER,))
    model = ModelSection(
        id="fake-model", loras=(LoraSection(id=ADAPTER.id, path=ADAPTER.path, scale=0.0),)
    )
    settings = Settings(models=(model,), auth=AuthSection(api_keys=("key-a", "key-b")))
    app = create_app(settings, engine=fake)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        body = {"model": "fake-model", "prompt": "x", "lora": [{"id": "pirate", "scale": 0.5}]}
        for headers in (A, B):
            assert (await c.post("/v1/completions", json=body, headers=headers)).status_code == 200
        assert fake.submitted[-1].prefix_salt != fake.submitted[-1].cache_salt  # LoRA-salted
        mine = (await c.get("/v1/cache", headers=A)).json()["data"][0]
        assert (mine["entries"], mine["tokens"]) == (1, 1)
        purged = (await c.delete("/v1/cache", headers=A)).json()
        assert purged["entries_removed"] == 1
        assert (await c.get("/v1/cache", headers=A)).json()["data"][0]["entries"] == 0
        assert (await c.get("/v1/cache", headers=B)).json()["data"][0]["entries"] == 1
