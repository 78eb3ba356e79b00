"""The secret that seals `reasoning.encrypted_content` outlives the process: a blob made by
one app is read by another app with the same `[responses] seal_secret` (replicas) or the
same disk cache directory (a restart); a blob sealed under another secret is foreign,
dropped with a log line; the key file is made 0600; the secret is never logged."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.client import CacheConfig
from server.api.responses.sealed import KEY_FILE
from server.config.tree import ConfigError, ModelSection, ResponsesSection, Settings, load_settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.responses.test_codex import THINKING
from tests.server.api.responses.test_responses import req

REASONING = "Plan: greet back."
BODY = req(store=False, include=["reasoning.encrypted_content"])
SECRET = "a secret all replicas share"


def settings(*, secret: str = "", disk_dir: str = "") -> Settings:
    """The thinking template's model; the disk cache in `disk_dir` ("": none)."""
    cache = CacheConfig(disk_dir=disk_dir) if disk_dir else CacheConfig(enabled=False)
    return Settings(models=(ModelSection(id="fake-model", chat_template=THINKING),),
                    cache=cache, responses=ResponsesSection(seal_secret=secret))  # fmt: skip


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=32768)


async def sealed_turn(client: httpx.AsyncClient, fake: FakeEngine) -> list[dict[str, Any]]:
    """A first turn's output (its reasoning item with its blob, then its message)."""
    fake.reply = f"<think>{REASONING}</think>Hello!".encode()
    r = await client.post("/v1/responses", json=BODY)
    assert r.status_code == 200, r.text
    output: list[dict[str, Any]] = r.json()["output"]
    assert output[0]["encrypted_content"].startswith("kvs1.")
    return output


async def reasoning_kept(client: httpx.AsyncClient, fake: FakeEngine, output: list[Any]) -> bool:
    """Whether `client` renders the reasoning of `output` sent back (the client's copy in
    `content` left out: only the blob can bring it back)."""
    item = {k: v for k, v in output[0].items() if k != "content"}
    turn = [{"role": "user", "content": "Hi"}, item, output[1],
            {"role": "user", "content": "And now?"}]  # fmt: skip
    r = await client.post("/v1/responses", json={**BODY, "input": turn})
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[-1].prompt_tokens).decode()
    return f"<think>{REASONING}</think>Hello!" in prompt


async def test_replicas_with_one_secret_read_each_others_blobs(
    make_client: ClientFactory, fake: FakeEngine, tmp_path: Path
) -> None:
    # each replica has a disk cache of its own: only the setting is shared
    one = make_client(fake, settings=settings(secret=SECRET, disk_dir=str(tmp_path / "a")))
    two = make_client(fake, settings=settings(secret=SECRET, disk_dir=str(tmp_path / "b")))
    output = await sealed_turn(one, fake)
    assert await reasoning_kept(two, fake, output)
    assert not (tmp_path / "a" / KEY_FILE).exists()  # the setting wins over the key file


async def test_another_secret_drops_the_blob_as_foreign(
    make_client: ClientFactory, fake: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    one = make_client(fake, settings=settings(secret=SECRET))
    other = make_client(fake, settings=settings(secret="the other replica's own secret"))
    output = await sealed_turn(one, fake)
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        assert not await reasoning_kept(other, fake, output)
    assert "input[1].encrypted_content was not sealed with this server's secret" in caplog.text
    assert SECRET not in caplog.text and "other replica's own" not in caplog.text


async def test_a_restart_reads_its_own_blobs_through_the_key_file(
    make_client: ClientFactory, fake: FakeEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = str(tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        output = await sealed_turn(make_client(fake, settings=settings(disk_dir=disk)), fake)
    key_file = Path(disk) / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(bytes.fromhex(key)) == 32
    assert str(key_file) in caplog.text and key not in caplog.text  # where, never what
    assert os.listdir(disk) == [KEY_FILE]  # no temporary file left behind
    restarted = make_client(fake, settings=settings(disk_dir=disk))
    assert await reasoning_kept(restarted, fake, output)
    assert key_file.read_text().strip() == key  # read, not made again
    # another directory is another key: the blob is foreign there
    elsewhere = make_client(fake, settings=settings(disk_dir=str(tmp_path / "other")))
    assert not await reasoning_kept(elsewhere, fake, output)


async def test_without_a_disk_cache_the_key_is_the_process_own(
    make_client: ClientFactory, fake: FakeEngine
) -> None:
    output = await sealed_turn(make_client(fake, settings=settings()), fake)
    assert not await reasoning_kept(make_client(fake, settings=settings()), fake, output)


async def test_an_unreadable_key_file_falls_back_to_a_process_key(
    make_client: ClientFactory, fake: FakeEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / KEY_FILE).write_text("not hex\n")
    client = make_client(fake, settings=settings(disk_dir=str(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="kvserve.server"):
        output = await sealed_turn(client, fake)  # still served
    assert "key file is not usable" in caplog.text
    assert await reasoning_kept(client, fake, output)  # its own blobs, within the process
    assert (tmp_path / KEY_FILE).read_text() == "not hex\n"  # someone's file, left alone


def test_the_setting_from_the_environment_and_its_bounds() -> None:
    env = {"KVSERVE_RESPONSES_SEAL_SECRET": SECRET}
    loaded = load_settings(env=env)
    assert loaded.responses.seal_secret == SECRET
    assert loaded.masked()["responses"]["seal_secret"] == "***"  # --print-config
    with pytest.raises(ConfigError, match=r"^responses\.seal_secret: must be empty or at least 16"):
        load_settings(env={"KVSERVE_RESPONSES_SEAL_SECRET": "short"})
