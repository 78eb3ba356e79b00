"""A model entry's `mmproj` (issue 50): a named projector that must exist, "none", and
the one found beside a local GGUF (engine/llama/vision.py `projector_beside`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine.client import NO_PROJECTOR
from engine.llama import projector_beside
from server.config.tree import ConfigError, load_settings


def _gguf(path: Path) -> Path:
    path.write_bytes(b"GGUF")
    return path


def test_a_named_projector_that_is_not_there_is_a_config_error(tmp_path: Path) -> None:
    model = _gguf(tmp_path / "m.gguf")
    cfg = tmp_path / "k.toml"
    cfg.write_text(f'[[models]]\npath = "{model}"\nmmproj = "{tmp_path}/nope.gguf"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(str(cfg), env={})
    assert str(info.value) == f"models[0].mmproj: file not found: {tmp_path}/nope.gguf"
    # the same through the environment's key for [model]
    with pytest.raises(ConfigError, match=r"^model\.mmproj: file not found: /no/mmproj\.gguf$"):
        load_settings(
            env={"KVSERVE_MODEL_PATH": str(model), "KVSERVE_MODEL_MMPROJ": "/no/mmproj.gguf"}
        )


def test_a_named_projector_and_none_are_taken(tmp_path: Path) -> None:
    model = _gguf(tmp_path / "m.gguf")
    projector = _gguf(tmp_path / "p.gguf")
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        f'[[models]]\nid = "a"\npath = "{model}"\nmmproj = "{projector}"\n'
        f'[[models]]\nid = "b"\npath = "{model}"\nmmproj = "none"\n'
        f'[[models]]\nid = "c"\nhf_repo = "o/r:Q8_0"\nmmproj = "none"\n'
    )
    a, b, c = load_settings(str(cfg), env={}).models
    assert a.mmproj == str(projector)
    assert b.mmproj == c.mmproj == NO_PROJECTOR == "none"


def test_the_one_projector_beside_the_model_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _gguf(tmp_path / "SmolVLM-Q8_0.gguf")
    assert projector_beside(str(model)) is None
    _gguf(tmp_path / "README-mmproj.gguf")  # not named mmproj*: not a projector
    (tmp_path / "mmproj-notes.txt").write_text("x")  # not a GGUF
    assert projector_beside(str(model)) is None
    projector = _gguf(tmp_path / "mmproj-SmolVLM-f16.gguf")
    assert projector_beside(str(model)) == str(projector)
    monkeypatch.chdir(tmp_path)  # a relative model path: its folder made absolute
    assert projector_beside(model.name) == str(projector)


def test_several_projectors_beside_the_model_none_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _gguf(tmp_path / "m.gguf")
    _gguf(tmp_path / "mmproj-m-f16.gguf")
    _gguf(tmp_path / "mmproj-m-Q8_0.gguf")
    with caplog.at_level(logging.WARNING, logger="engine.llama.vision"):
        assert projector_beside(str(model)) is None
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "2 mmproj*.gguf beside" in warning.getMessage()
    assert "name one with `mmproj`" in warning.getMessage()


def test_no_folder_no_projector(tmp_path: Path) -> None:
    assert projector_beside(str(tmp_path / "gone" / "m.gguf")) is None
