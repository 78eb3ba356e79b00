"""Model-section keys of issue 14: hub sources (and their validation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cli.main import main
from server.config.tree import ConfigError, hub_source, load_settings


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
        ("[[models]]\nhf_repo = 3\n", r"models\[0\]\.hf_repo: expected a string"),
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
    assert (
        err
        == "kvserve: configuration error: model.hf_repo: expected org/name[:QUANT], got 'a/b/c'\n"
    )


def test_lora_tables(tmp_path: Path) -> None:
    adapter = tmp_path / "a.gguf"
    adapter.write_bytes(b"GGUF")
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        f'[[models]]\nid = "m"\n[[models.loras]]\nid = "a"\npath = "{adapter}"\nscale = 0.5\n'
    )
    (m,) = load_settings(str(cfg), env={}).models
    assert [(a.id, a.path, a.scale) for a in m.loras] == [("a", str(adapter), 0.5)]


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ('[[models.loras]]\npath = "{p}"\n', r"models\[0\]\.loras\[0\]\.id: required"),
        ('[[models.loras]]\nid = "a"\n', r"models\[0\]\.loras\[0\]\.path: give either path or hf_repo"),
        ('[[models.loras]]\nid = "a"\npath = "/nope.gguf"\n', "path: file not found"),
        ('[[models.loras]]\nid = "a"\npath = "{p}"\nscale = "x"\n', "scale: expected a number"),
        ('[[models.loras]]\nid = "a"\npath = "{p}"\nrank = 8\n', r"loras\[0\]\.rank: unknown key"),
        (
            '[[models.loras]]\nid = "a"\npath = "{p}"\n[[models.loras]]\nid = "a"\npath = "{p}"\n',
            r"loras\[1\]\.id: 'a' is used twice",
        ),
        ("loras = 3\n", r"models\[0\]\.loras: expected"),
        ('[[models.loras]]\nid = "a"\npath = "{p}"\nhf_repo = "o/r"\n', "either path or hf_repo"),
        ('[[models.loras]]\nid = "a"\nhf_repo = "o"\n', r"loras\[0\]\.hf_repo: expected org/name"),
    ],
)
def test_bad_lora_tables(tmp_path: Path, tables: str, message: str) -> None:
    adapter = tmp_path / "a.gguf"
    adapter.write_bytes(b"GGUF")
    cfg = tmp_path / "k.toml"
    cfg.write_text('[[models]]\nid = "m"\n' + tables.replace("{p}", str(adapter)))
    with pytest.raises(ConfigError, match=message):
        load_settings(str(cfg), env={})
