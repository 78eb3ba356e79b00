from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from server.config.tree import (
    SECTIONS,
    ConfigError,
    ModelSection,
    Settings,
    default_model_path,
    load_settings,
)

BUNDLED = default_model_path()


def test_defaults_use_the_bundled_model() -> None:
    s = load_settings(env={})
    assert [m.model_path for m in s.models] == [BUNDLED]
    assert Path(BUNDLED).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (s.server.host, s.server.port) == ("127.0.0.1", 8080)
    assert s.models[0].engine == s.engine


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[model]\nn_seq_max = 4\n')
    s = load_settings(str(cfg), env={"KVSERVE_SERVER_PORT": "9100"})
    assert (s.server.port, s.server.host, s.models[0].engine.n_seq_max) == (9100, "0.0.0.0", 4)
    s = load_settings(
        str(cfg), env={"KVSERVE_SERVER_PORT": "9100"}, overrides={"server.port": 9200}
    )
    assert s.server.port == 9200
    # An engine key from the environment or a flag beats the model's own value.
    s = load_settings(str(cfg), env={"KVSERVE_ENGINE_N_SEQ_MAX": "2"})
    assert s.models[0].engine.n_seq_max == 2
    s = load_settings(str(cfg), env={"KVSERVE_ENGINE_N_SEQ_MAX": "2"}, overrides={"engine.n_seq_max": 3})
    assert s.models[0].engine.n_seq_max == 3
    s = load_settings(env={"KVSERVE_AUTH_API_KEYS": "a, b", "KVSERVE_SERVER_SHUTDOWN_GRACE_S": "2.5"})
    assert s.auth.api_keys == ("a", "b") and s.server.shutdown_grace_s == 2.5
    s = load_settings(env={"KVSERVE_MODEL_ID": "m", "KVSERVE_MODEL_ALIASES": "x,y"})
    assert (s.models[0].id, s.models[0].aliases) == ("m", ("x", "y"))


def test_several_models_with_their_own_engine_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        "[engine]\nn_ctx = 1024\nn_seq_max = 4\n"
        f'[[models]]\nid = "a"\naliases = ["gpt-4o"]\npath = "{BUNDLED}"\n'
        f'[[models]]\nid = "b"\npath = "{BUNDLED}"\nn_seq_max = 2\nchat_template = "{{{{ x }}}}"\n'
    )
    s = load_settings(str(cfg), env={})
    a, b = s.models
    assert (a.id, a.aliases, a.engine.n_ctx, a.engine.n_seq_max) == ("a", ("gpt-4o",), 1024, 4)
    assert (b.id, b.engine.n_ctx, b.engine.n_seq_max, b.chat_template) == ("b", 1024, 2, "{{ x }}")
    s = load_settings(str(cfg), env={}, overrides={"engine.n_ctx": 512})
    assert [m.engine.n_ctx for m in s.models] == [512, 512]
    with pytest.raises(ConfigError, match="--model-id: only with a single model"):
        load_settings(
            str(cfg), env={}, overrides={"model.id": "c"}, flag_names={"model.id": "--model-id"}
        )


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ("[server]\nprot = 1\n", {}, "server.prot: unknown key"),
        ("[servr]\n", {}, "servr: unknown section"),
        ('[server]\nport = "x"\n', {}, "server.port: expected an integer"),
        ("[server]\nport = 0\n", {}, "server.port"),
        ('[server]\nshutdown_grace_s = "soon"\n', {}, "server.shutdown_grace_s: expected a number"),
        ("[server]\napi_keys = []\n", {}, "server.api_keys: unknown key"),
        ('[model]\npath = "/no/such.gguf"\n', {}, "model.path: file not found"),
        ('[[models]]\npath = "/no/such.gguf"\n', {}, "models[0].path: file not found"),
        ('[[models]]\nid = "a"\n[[models]]\nid = "b"\nbogus = 1\n', {}, "models[1].bogus: unknown key"),
        ('[[models]]\nid = "a"\n[[models]]\naliases = ["a"]\n', {}, "models[1]: the name 'a' is used by two models"),
        ('[model]\nid = "a"\n[[models]]\nid = "b"\n', {}, "not both"),
        ("[model]\nn_batch = 2\n", {}, "model.n_batch"),
        # a 65..127-token prompt could never be scheduled (issue 10)
        (  # exact reuse (not the default) needs prefill chunks of 130+ rows
            "[model]\nprefill_chunk = 100\nexact_reuse = true\n",
            {},
            "model.prefill_chunk: must be at least 130",
        ),
        (
            "[model]\nn_batch = 130\nn_seq_max = 8\nexact_reuse = true\n",
            {},
            "model.n_batch: must be at least 130",
        ),
        ("[engine]\ntoken_timeout_s = -1\n", {}, "token_timeout_s: must not be negative"),
        ('[model]\ncontext_overflow = "truncate"\n', {}, "model.context_overflow"),
        ("[engine]\nn_ctx = 0\n", {}, "engine.n_ctx: must be at least 1"),
        ("[auth]\napi_keys = [1]\n", {}, "auth.api_keys: expected a list of strings"),
        ('[logging]\nlevel = "loud"\n', {}, "logging.level"),
        ("[logging]\njson = 1\n", {}, "logging.json: expected true or false"),
        ("", {"KVSERVE_ENGINE_EMBEDDINGS": "maybe"}, "KVSERVE_ENGINE_EMBEDDINGS"),
        ("", {"KVSERVE_SERVER_SHUTDOWN_GRACE_S": "inf"}, "KVSERVE_SERVER_SHUTDOWN_GRACE_S"),
        ("not toml [", {}, "not valid TOML"),
    ],
)
def test_bad_configuration_names_the_key(
    tmp_path: Path, text: str, env: dict[str, str], fragment: str
) -> None:
    assert fragment in config_error(tmp_path, text, env)


def config_error(tmp_path: Path, text: str, env: dict[str, str]) -> str:
    """The message of the ConfigError that loading `text` as the file (and `env`) raises."""
    cfg = tmp_path / "k.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(str(cfg), env=env)
    return str(err.value)


def kvserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_cli_reports_config_errors_in_one_line_with_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text("[server]\nbogus = 1\n")
    run = kvserve("--config", str(cfg))
    assert run.returncode == 2
    assert run.stderr.strip() == "kvserve: configuration error: server.bogus: unknown key"
    run = kvserve("--model", "/no/such.gguf")
    assert run.returncode == 2
    assert run.stderr.strip() == "kvserve: configuration error: model.path: file not found: /no/such.gguf"
    run = kvserve("--config", str(tmp_path / "missing.toml"))
    assert run.returncode == 2 and "Traceback" not in run.stderr


def test_print_config_masks_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[auth]\napi_keys = ["sk-file"]\n[[models]]\nid = "m"\n')
    run = kvserve("--print-config", "--config", str(cfg), "--api-key", "sk-secret", "--parallel", "3")
    assert run.returncode == 0, run.stderr
    assert "sk-secret" not in run.stdout and "sk-file" not in run.stdout
    shown = json.loads(run.stdout)
    assert shown["auth"]["api_keys"] == ["***"]
    assert shown["models"][0]["id"] == "m" and shown["models"][0]["path"] == BUNDLED
    assert shown["models"][0]["engine"]["n_seq_max"] == 3
    assert set(shown) == {f.name for f in dataclasses.fields(Settings)}


def test_example_config_lists_every_key_with_its_default() -> None:
    example = tomllib.loads((Path(__file__).parents[3] / "config.example.toml").read_text())
    defaults = Settings()
    for name in SECTIONS:
        listed = {k: tuple(v) if isinstance(v, list) else v for k, v in example[name].items()}
        assert listed == dataclasses.asdict(getattr(defaults, name)), name
    model = dataclasses.asdict(ModelSection())
    del model["engine"]  # the [engine] section lists those
    (entry,) = example["models"]
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()} == model
    assert set(example) == {*SECTIONS, "models"}
    # ... and the example is a valid configuration as it stands.
    assert load_settings(str(Path(__file__).parents[3] / "config.example.toml"), env={}) == Settings()


def test_the_disk_tier_is_on_by_default_in_the_users_cache_directory(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "HOME")}
    xdg = {**base, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    shown = json.loads(kvserve("--print-config", env=xdg).stdout)
    assert shown["cache"]["disk_dir"] == str(tmp_path / "xdg" / "kvserve")
    # XDG_CACHE_HOME unset (or empty, as the XDG spec reads it): ~/.cache/kvserve
    home = {**base, "XDG_CACHE_HOME": "", "HOME": str(tmp_path / "home")}
    shown = json.loads(kvserve("--print-config", env=home).stdout)
    assert shown["cache"]["disk_dir"] == str(tmp_path / "home" / ".cache" / "kvserve")
    # --no-disk-cache, or disk_dir = "" in a file or the environment, turns it off
    shown = json.loads(kvserve("--print-config", "--no-disk-cache", env=xdg).stdout)
    assert shown["cache"]["disk_dir"] == ""
    assert load_settings(env={"KVSERVE_CACHE_DISK_DIR": ""}).cache.disk_path == ""
    cfg = tmp_path / "k.toml"
    cfg.write_text('[cache]\ndisk_dir = ""\n')
    assert load_settings(str(cfg), env={}).cache.disk_path == ""
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()  # only read


def test_a_disk_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kvserve").write_text("not a directory")
    with pytest.raises(ConfigError, match="cache.disk_dir: not a directory"):
        load_settings(env={"KVSERVE_CACHE_DISK_DIR": str(tmp_path / "kvserve")})


def test_shared_tier_settings_are_checked() -> None:
    ok = load_settings(env={"KVSERVE_CACHE_SHARED_URL": "redis://cache:6379/0"})
    assert ok.cache.shared_url == "redis://cache:6379/0"
    for env, message in (
        ({"KVSERVE_CACHE_SHARED_URL": "http://cache:6379"}, "cache.shared_url: must start with"),
        ({"KVSERVE_CACHE_SHARED_TIMEOUT_S": "0"}, "cache.shared_timeout_s: must be above 0"),
        ({"KVSERVE_CACHE_SHARED_TTL_S": "-1"}, "cache.shared_ttl_s: must be at least 1"),
        ({"KVSERVE_CACHE_SHARED_RETRY_S": "-1"}, "cache.shared_retry_s: must not be negative"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_settings(env=env)


def _start_without_serving(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """`kvserve` up to the point where it would serve: what it would have served."""
    import server.process.serve
    import server.telemetry.logs

    served: list[Settings] = []
    monkeypatch.setattr(server.process.serve, "serve", lambda s: served.append(s) or 0)
    monkeypatch.setattr(server.telemetry.logs, "setup_logging", lambda _: None)
    return served


def test_start_probes_the_resolved_disk_dir_not_a_local_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.cli.main import main

    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.delenv("KVSERVE_CACHE_DISK_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    served = _start_without_serving(monkeypatch)
    assert main([]) == 0 and len(served) == 1
    assert list((tmp_path / "cwd").iterdir()) == []  # no stray ./auto (issue 17)
    assert (tmp_path / "xdg" / "kvserve").is_dir()  # the real directory was probed
    # ... so an unusable one stops the start with exit 2, before anything is served
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    assert main([]) == 2 and len(served) == 1
    assert list((tmp_path / "cwd").iterdir()) == []


@pytest.mark.parametrize(
    ("key", "values"),
    [
        ("block_tokens", (-1, 0, 1, 64)),
        ("writer_queue", (-1, 0, 1)),
        ("ram_bytes", (-1, 0, 1)),
        ("disk_bytes", (-1, 0, 1)),
        ("min_tokens", (-1, 0, 1)),
        ("shared_timeout_s", (-1.0, 0.0, 0.001, 1.0)),
        ("shared_retry_s", (-1.0, 0.0, 0.5)),
        ("shared_ttl_s", (-1.0, 0.0, 0.5, 0.999, 1.0, 86400.0)),
    ],
)
def test_config_accepts_exactly_the_cache_values_the_cache_accepts(
    key: str, values: tuple[float, ...]
) -> None:
    from cache import CacheConfig

    for value in values:
        try:
            CacheConfig(**{key: value})
            cache_ok = True
        except ValueError:
            cache_ok = False
        try:
            load_settings(env={f"KVSERVE_CACHE_{key.upper()}": str(value)})
            config_ok = True
        except ConfigError as exc:
            assert str(exc).startswith(f"cache.{key}: "), exc
            config_ok = False
        assert config_ok == cache_ok, (key, value)  # issue 17: shared_ttl_s = 0.5


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("n_seq_max", [1, 4, 8])
def test_config_accepts_exactly_the_batch_sizes_the_scheduler_accepts(
    exact: bool, n_seq_max: int
) -> None:
    from engine.thread.scheduler import Scheduler, SchedulerConfig

    for n_batch in range(n_seq_max - 1, 140):
        for prefill_chunk in (1, 64, 127, 128, 256):
            try:
                Scheduler(SchedulerConfig(n_seq_max, 4096, 512, n_batch, prefill_chunk, exact))
                scheduler_ok = True
            except ValueError:
                scheduler_ok = False
            env = {
                "KVSERVE_ENGINE_N_SEQ_MAX": str(n_seq_max),
                "KVSERVE_ENGINE_N_BATCH": str(n_batch),
                "KVSERVE_ENGINE_PREFILL_CHUNK": str(prefill_chunk),
                "KVSERVE_ENGINE_EXACT_REUSE": str(exact).lower(),
                "KVSERVE_ENGINE_N_UBATCH": "0",
            }
            try:
                load_settings(env=env)
                config_ok = True
            except ConfigError:
                config_ok = False
            assert config_ok == scheduler_ok, (n_batch, prefill_chunk)


def test_a_bad_cache_value_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from server.cli.main import main

    cfg = tmp_path / "k.toml"
    cfg.write_text("[cache]\nshared_ttl_s = 0.5\n")
    assert main(["--config", str(cfg), "--print-config"]) == 2
    assert capsys.readouterr().err == (
        "kvserve: configuration error: cache.shared_ttl_s: must be at least 1 (second), got 0.5\n"
    )
