"""Fetching GGUFs from a Hugging Face-compatible hub: a stand-in on loopback, no internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server.config.hub import HubError, HubSource
from server.models.hub import choose_file, fetch
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, serving, start

REPO = "kvtest/tiny-GGUF"


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    return fake_gguf(tmp_path)


@pytest.fixture
def hub(gguf: Path) -> Iterator[StandIn]:
    files = {
        "tiny-Q4_K_M.gguf": HubFile(gguf),
        "tiny-Q8_0.gguf": HubFile(gguf),
        "README.md": HubFile(gguf),
    }
    with serving(StandIn({REPO: files})) as stand_in:
        yield stand_in


def _src(tmp_path: Path, spec: str = REPO + ":Q8_0", **kw: str) -> HubSource:
    return HubSource.parse("models[0].hf_repo", spec, cache_dir=str(tmp_path / "hf"), **kw)


def test_download_then_cache_hit(hub: StandIn, gguf: Path, tmp_path: Path) -> None:
    seen: list[float] = []
    path = fetch(_src(tmp_path), seen.append, endpoint=hub.url, offline=False)
    assert Path(path).read_bytes() == gguf.read_bytes()
    assert hub.downloads == ["tiny-Q8_0.gguf"]
    assert seen and seen[-1] == 1.0 and all(0 <= p <= 1 for p in seen)
    again = fetch(_src(tmp_path), endpoint=hub.url, offline=False)
    assert again == path
    assert hub.downloads == ["tiny-Q8_0.gguf"]  # not fetched a second time


def test_offline_uses_the_cache(hub: StandIn, tmp_path: Path) -> None:
    with pytest.raises(HubError, match=r"^models\[0\]\.hf_repo: "):
        fetch(_src(tmp_path), endpoint=hub.url, offline=True)  # nothing cached yet
    path = fetch(_src(tmp_path), endpoint=hub.url, offline=False)
    hub.repos.clear()  # the hub is gone: offline mode must not ask it
    assert fetch(_src(tmp_path), endpoint=hub.url, offline=True) == path
    assert fetch(_src(tmp_path, REPO + ":Q8_0"), endpoint="http://127.0.0.1:9", offline=True)


@pytest.mark.parametrize("outage", ["stopped", 503, 429])
def test_a_hub_outage_uses_the_cached_file(
    gguf: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, outage: str | int
) -> None:
    stand_in, server = start(StandIn({REPO: {"tiny-Q8_0.gguf": HubFile(gguf)}}))
    try:
        path = fetch(_src(tmp_path), endpoint=stand_in.url, offline=False)
        if outage == "stopped":  # nothing listens there any more: connection refused
            server.shutdown()
            server.server_close()
        else:
            stand_in.outage = int(outage)
        with caplog.at_level("WARNING", logger="kvserve.server"):
            assert fetch(_src(tmp_path), endpoint=stand_in.url, offline=False) == path
        (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warning.startswith("models[0].hf_repo: the hub cannot be reached (")
        assert warning.endswith("using the copy in the local cache")
        # Nothing in the local cache: the outage is still an error naming the key.
        with pytest.raises(HubError, match=r"^models\[0\]\.hf_repo: download failed"):
            fetch(_src(tmp_path / "other"), endpoint=stand_in.url, offline=False)
        assert stand_in.downloads == ["tiny-Q8_0.gguf"]
    finally:
        if outage != "stopped":
            server.shutdown()
            server.server_close()


def test_an_answer_of_the_hub_is_not_an_outage(hub: StandIn, tmp_path: Path) -> None:
    fetch(_src(tmp_path), endpoint=hub.url, offline=False)
    hub.repos.clear()  # the hub says the repository is gone: that is news, not an outage
    with pytest.raises(HubError, match="repository kvtest/tiny-GGUF not found"):
        fetch(_src(tmp_path), endpoint=hub.url, offline=False)


def test_checksum_mismatch_refused(hub: StandIn, tmp_path: Path) -> None:
    hub.repos[REPO]["tiny-Q8_0.gguf"].sha256 = "0" * 64
    with pytest.raises(HubError, match="sha256 mismatch"):
        fetch(_src(tmp_path), endpoint=hub.url, offline=False)
    blobs = list((tmp_path / "hf").rglob("blobs/*"))
    assert blobs == []  # neither kept nor half kept


@pytest.mark.parametrize(
    ("spec", "file", "message"),
    [
        ("kvtest/missing:Q8_0", "", "repository kvtest/missing not found"),
        (REPO, "", r"ambiguous \(no quant given\)"),
        (REPO + ":Q2_K", "", "no GGUF file for quant Q2_K"),
        (REPO, "other.gguf", "file 'other.gguf' not found"),
    ],
)
def test_errors_name_the_key(
    hub: StandIn, tmp_path: Path, spec: str, file: str, message: str
) -> None:
    with pytest.raises(HubError, match=message) as info:
        fetch(_src(tmp_path, spec, file=file), endpoint=hub.url, offline=False)
    assert str(info.value).startswith("models[0].hf_repo: ")
    assert "\n" not in str(info.value)


def test_network_failure(tmp_path: Path) -> None:
    with pytest.raises(HubError, match=r"models\[0\]\.hf_repo: download failed"):
        fetch(_src(tmp_path), endpoint="http://127.0.0.1:9", offline=False)


def test_choose_file() -> None:
    src = HubSource.parse("k", "a/b:Q4_K")
    names = ["m-Q4_K_M.gguf", "m-Q4_K.gguf", "mmproj-Q4_K.gguf"]
    assert choose_file(src, names) == "m-Q4_K.gguf"  # a whole tag, not a prefix
    assert choose_file(HubSource.parse("k", "a/b"), ["only.gguf", "x.md"]) == "only.gguf"
    with pytest.raises(HubError, match="no GGUF file in a/b"):
        choose_file(HubSource.parse("k", "a/b"), ["x.safetensors"])
    with pytest.raises(HubError, match="split GGUF"):
        choose_file(src, ["m-Q4_K-00001-of-00002.gguf", "m-Q4_K-00002-of-00002.gguf"])
    for bad in ("noslash", "a/b/c", "/b"):
        with pytest.raises(HubError, match="expected org/name"):
            HubSource.parse("k", bad)


async def test_health_shows_the_download(make_client: ClientFactory) -> None:
    engine = FakeEngine(ready=False)
    engine.load_phase, engine.load_progress = "downloading", 0.4
    r = await make_client(engine).get("/health")
    assert r.status_code == 503
    assert r.json()["models"]["fake-model"] == {
        "status": "loading",
        "progress": 0.4,
        "phase": "downloading",
    }


def test_offline_mode_from_the_environment(
    hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match=r"^models\[0\]\.hf_repo: "):
        fetch(_src(tmp_path), endpoint=hub.url)  # offline: the hub is not asked
    assert hub.downloads == []


def test_hf_token_is_sent(hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    fetch(_src(tmp_path), endpoint=hub.url, offline=False)
    assert hub.authorizations and set(hub.authorizations) == {"Bearer hf_test_token"}
