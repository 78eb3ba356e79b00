"""Model-section keys of issue 14: hub sources (and their validation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cli import main
from server.config import ConfigError, hub_source, load_settings


def test_hf_repo_flag_names_the_model_after_the_repo() -> None:
    s = load_settings(env={}, overrides={"model.hf_repo": "org/name:Q4_K_M"})
    (m,) = s.models
    assert (m.id, m.model_path) == ("org/name", "")
    src = hub_source("model", m, s.hub)
    assert (src.repo, src.quant, src.file, src.key) == ("org/name", "Q4_K_M", "", "model.hf_repo")


def test_hub_keys_in_a_models_entry(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        '[hub]\ncache_dir = "/tmp/x"\n'
        '[[models]]\nid = "m"\nhf_repo = "o/r"\nhf_file = "a.gguf"\nrevision = "v1"\n'
    )
    s = load_settings(str(cfg), env={})
    src = hub_source("models[0]", s.models[0], s.hub)
    assert (src.repo, src.file, src.revision, src.cache_dir) == ("o/r", "a.gguf", "v1", "/tmp/x")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[model]\nhf_repo = "noslash"\n', r"model\.hf_repo: expected org/name"),
        ('[model]\nhf_repo = "o/r"\npath = "/x.gguf"\n', "either path or hf_repo"),
        ('[model]\nhf_repo = "o/r:Q4_0"\nhf_file = "a.gguf"\n', "quant tag or hf_file"),
        ('[[models]]\nhf_repo = 3\n', r"models\[0\]\.hf_repo: expected a string"),
        ('[hub]\nmirror = "x"\n', r"hub\.mirror: unknown key"),
    ],
)
def test_bad_hub_keys(tmp_path: Path, toml: str, message: str) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_settings(str(cfg), env={})


def test_bad_hf_repo_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hf-repo", "a/b/c", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err == "kvserve: configuration error: model.hf_repo: expected org/name[:QUANT], got 'a/b/c'\n"
