"""A hub model's vision projector comes along as llama-server's `-hf` fetches it
(server/models/hub.py `choose_projector`, `fetch(..., projector=True)`; engine/thread/loading.py
`fetched`, `projector_of`): a stand-in hub on loopback, no model loaded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.client import NO_PROJECTOR, EngineConfig
from engine.thread.loading import fetched, projector_of
from server.app import engine_config
from server.config.hub import HubSection, HubSource
from server.config.model_entries import ModelSection
from server.config.tree import Settings
from server.models.hub import NoRoom, choose_projector, fetch
from tests.helpers.hub_standin import HubFile, StandIn, point_hub_at, serving

REPO = "kvtest/tiny-VLM-GGUF"


def _file(folder: Path, name: str) -> HubFile:
    """A GGUF by its magic only, different bytes for each name (distinct blobs)."""
    path = folder / name.replace("/", "_")
    path.write_bytes(b"GGUF" + name.encode() + os.urandom(4096))
    return HubFile(path)


def _repo(folder: Path, *names: str) -> dict[str, HubFile]:
    return {name: _file(folder, name) for name in names}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[StandIn]:
    files = tmp_path / "files"
    files.mkdir()
    repos = {
        # one projector beside two quants of the model (ggml-org's Gemma 3 layout)
        REPO: _repo(files, "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"),
        # a projector per precision (ggml-org's SmolVLM layout)
        "kvtest/several": _repo(
            files,
            "m-Q8_0.gguf",
            "m-f16.gguf",
            "m-Q4_K_M.gguf",
            "mmproj-m-Q8_0.gguf",
            "mmproj-m-f16.gguf",
        ),  # fmt: skip
        "kvtest/text-only": _repo(files, "t-Q8_0.gguf", "README.md"),
    }
    with serving(StandIn(repos)) as stand_in:
        yield stand_in


def _src(tmp_path: Path, spec: str) -> HubSource:
    return HubSource.parse("models[0].hf_repo", spec, cache_dir=str(tmp_path / "hf"))


def test_the_rule_is_llama_cpps() -> None:
    several = ["m-Q8_0.gguf", "m-f16.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-f16.gguf", "x.md"]
    assert choose_projector("m-Q8_0.gguf", several) == "mmproj-m-Q8_0.gguf"  # same bits
    assert choose_projector("m-f16.gguf", several) == "mmproj-m-f16.gguf"
    assert choose_projector("m-BF16.gguf", several) == "mmproj-m-f16.gguf"  # 16 bits both
    assert choose_projector("m-Q4_K_M.gguf", several) == "mmproj-m-Q8_0.gguf"  # 4: 8 nearer
    assert choose_projector("m-Q8_0.gguf", ["m-Q8_0.gguf", "x.md"]) is None
    # the model's folder before the one above it; never a folder beside or below it
    nested = ["mmproj-Q8_0.gguf", "vlm/mmproj-f16.gguf", "other/mmproj-Q4.gguf"]
    assert choose_projector("vlm/m-Q4_0.gguf", nested) == "vlm/mmproj-f16.gguf"
    assert choose_projector("m-Q4_0.gguf", nested) == "mmproj-Q8_0.gguf"
    assert choose_projector("m-Q4_0.gguf", ["vlm/mmproj-Q4_0.gguf"]) is None
    # the same distance: the first by name
    assert choose_projector("m.gguf", ["mmproj-b.gguf", "mmproj-a.gguf"]) == "mmproj-a.gguf"


def test_the_model_and_its_projector_are_both_fetched(hub: StandIn, tmp_path: Path) -> None:
    src = _src(tmp_path, REPO + ":Q8_0")
    model = fetch(src, endpoint=hub.url, offline=False)
    projector = fetch(src, projector=True, endpoint=hub.url, offline=False)
    assert Path(model).name == "tiny-Q8_0.gguf"
    assert Path(projector).name == "mmproj-tiny-f16.gguf"
    assert Path(projector).read_bytes() == hub.repos[REPO]["mmproj-tiny-f16.gguf"].path.read_bytes()
    assert hub.downloads == ["tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"]
    # cached: offline (or with the hub gone) the projector is still found
    assert fetch(src, projector=True, endpoint=hub.url, offline=True) == projector
    assert hub.downloads == ["tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"]


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("Q8_0", "mmproj-m-Q8_0.gguf"),
        ("f16", "mmproj-m-f16.gguf"),
        ("Q4_K_M", "mmproj-m-Q8_0.gguf"),
    ],
)
def test_several_projectors_the_rules_pick_only(
    hub: StandIn, tmp_path: Path, quant: str, expected: str
) -> None:
    path = fetch(
        _src(tmp_path, f"kvtest/several:{quant}"),
        endpoint=hub.url,
        offline=False,
        projector=True,
    )
    assert Path(path).name == expected
    assert hub.downloads == [expected]  # the other projector is not downloaded


def test_a_repository_without_projector_gives_none(hub: StandIn, tmp_path: Path) -> None:
    src = _src(tmp_path, "kvtest/text-only")
    assert fetch(src, projector=True, endpoint=hub.url, offline=False) == ""
    assert hub.downloads == []
    fetch(src, endpoint=hub.url, offline=False)
    assert (
        fetch(src, projector=True, endpoint=hub.url, offline=True) == ""
    )  # the cache: none either
    assert hub.downloads == ["t-Q8_0.gguf"]


def test_the_projector_passes_the_budget_check(hub: StandIn, tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    def refuse(filename: str, size: int) -> None:
        seen.append((filename, size))
        raise NoRoom(f"models[0].hf_repo: {filename} does not fit")

    src = _src(tmp_path, REPO + ":Q8_0")
    with pytest.raises(NoRoom, match="mmproj-tiny-f16.gguf does not fit"):
        fetch(src, projector=True, endpoint=hub.url, offline=False, before_download=refuse)
    size = hub.repos[REPO]["mmproj-tiny-f16.gguf"].path.stat().st_size
    assert seen == [("mmproj-tiny-f16.gguf", size)]
    assert hub.downloads == []  # refused before its first byte


class Report:
    load_progress = 0.0
    load_phase = "loading"
    loaded_bytes = 0
    load_cancelled = False


def _engine_config(
    hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, mmproj: str = ""
) -> EngineConfig:
    point_hub_at(hub, monkeypatch)
    settings = Settings(hub=HubSection(cache_dir=str(tmp_path / "hf")))
    return engine_config(ModelSection(id="vlm", hf_repo=spec, mmproj=mmproj), settings)


def test_a_hub_model_loads_its_repositorys_projector(
    hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = fetched(_engine_config(hub, tmp_path, monkeypatch, REPO + ":Q4_K_M"), Report())
    assert Path(cfg.model_path).name == "tiny-Q4_K_M.gguf"
    assert Path(cfg.mmproj).name == "mmproj-tiny-f16.gguf"
    assert projector_of(cfg) == cfg.mmproj  # the one the load hands to libmtmd
    assert hub.downloads == ["tiny-Q4_K_M.gguf", "mmproj-tiny-f16.gguf"]


def test_a_text_only_repository_loads_no_projector(
    hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = fetched(_engine_config(hub, tmp_path, monkeypatch, "kvtest/text-only"), Report())
    assert cfg.mmproj == NO_PROJECTOR
    assert projector_of(cfg) is None


@pytest.mark.parametrize("mmproj", [NO_PROJECTOR, "named"])
def test_mmproj_set_fetches_no_projector(
    hub: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mmproj: str
) -> None:
    named = tmp_path / "mmproj-mine.gguf"
    named.write_bytes(b"GGUF")
    value = str(named) if mmproj == "named" else mmproj
    cfg = _engine_config(hub, tmp_path, monkeypatch, REPO + ":Q8_0", value)
    assert cfg.fetch_mmproj is None
    cfg = fetched(cfg, Report())
    assert hub.downloads == ["tiny-Q8_0.gguf"]
    assert projector_of(cfg) == (str(named) if mmproj == "named" else None)


def test_none_turns_off_the_projector_beside_a_local_model(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    beside = tmp_path / "mmproj-m.gguf"
    model.write_bytes(b"GGUF")
    beside.write_bytes(b"GGUF")
    assert projector_of(EngineConfig(str(model), "m")) == str(beside)
    assert projector_of(EngineConfig(str(model), "m", mmproj=NO_PROJECTOR)) is None
