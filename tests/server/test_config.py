from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.config import ConfigError, default_model_path, load_settings


def test_defaults_use_the_bundled_model() -> None:
    s = load_settings(env={})
    assert s.model_path == default_model_path()
    assert Path(s.model_path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (s.server.host, s.server.port) == ("127.0.0.1", 8080)


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[model]\nn_seq_max = 4\n')
    s = load_settings(str(cfg), env={"KVSERVE_SERVER_PORT": "9100"})
    assert (s.server.port, s.server.host, s.model.n_seq_max) == (9100, "0.0.0.0", 4)
    s = load_settings(
        str(cfg), env={"KVSERVE_SERVER_PORT": "9100"}, overrides={"server.port": 9200}
    )
    assert s.server.port == 9200
    s = load_settings(env={"KVSERVE_SERVER_API_KEYS": "a, b"})
    assert s.server.api_keys == ("a", "b")


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ("[server]\nprot = 1\n", {}, "server.prot: unknown key"),
        ("[servr]\n", {}, "servr: unknown section"),
        ('[server]\nport = "x"\n', {}, "server.port: expected an integer"),
        ("[server]\nport = 0\n", {}, "server.port"),
        ('[model]\npath = "/no/such.gguf"\n', {}, "model.path: file not found"),
        ("[model]\nn_batch = 2\n", {}, "model.n_batch"),
        ("", {"KVSERVE_MODEL_EMBEDDINGS": "maybe"}, "KVSERVE_MODEL_EMBEDDINGS"),
        ("not toml [", {}, "not valid TOML"),
    ],
)
def test_bad_configuration_names_the_key(
    tmp_path: Path, text: str, env: dict[str, str], fragment: str
) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(str(cfg), env=env)
    assert fragment in str(err.value)


def test_cli_reports_config_errors_in_one_line_with_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text("[server]\nbogus = 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "server", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == "kvserve: configuration error: server.bogus: unknown key"


def test_print_config_masks_keys() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "server", "--print-config", "--api-key", "sk-secret"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    assert "sk-secret" not in run.stdout and '"***"' in run.stdout


def test_example_config_lists_every_key_with_its_default() -> None:
    import dataclasses
    import tomllib

    from server.config import ModelSection, ServerSection

    example = tomllib.loads((Path(__file__).parents[2] / "config.example.toml").read_text())
    for name, section in (("server", ServerSection()), ("model", ModelSection())):
        defaults = dataclasses.asdict(section)
        listed = {k: tuple(v) if isinstance(v, list) else v for k, v in example[name].items()}
        assert listed == defaults, name
