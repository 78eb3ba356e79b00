"""`[tracing]` settings: checked at start, one line naming the key, exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.config.tree import TracingSection, load_settings
from tests.server.config.test_config import config_error, kvserve


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ('[tracing]\nsample_ratio = 1.5\n', {}, "tracing.sample_ratio: between 0 and 1, got 1.5"),
        ('[tracing]\nsample_ratio = -0.1\n', {}, "tracing.sample_ratio: between 0 and 1"),
        ("", {"KVSERVE_TRACING_SAMPLE_RATIO": "half"}, "KVSERVE_TRACING_SAMPLE_RATIO: expected a number"),
        ('[tracing]\nsample_ratio = "1"\n', {}, "tracing.sample_ratio: expected a number"),
        ('[tracing]\notlp_endpoint = "localhost:4318"\n', {}, "tracing.otlp_endpoint: an http:// or https:// URL"),
        ('[tracing]\notlp_endpoint = "grpc://collector:4317"\n', {}, "tracing.otlp_endpoint"),
        ('[tracing]\notlp_endpoint = "http://"\n', {}, "tracing.otlp_endpoint"),
        ('[tracing]\nservice_name = " "\n', {}, "tracing.service_name: must not be empty"),
        ('[tracing]\nheaders = ["authorization"]\n', {}, "tracing.headers: 'authorization' is not name=value"),
        ('[tracing]\nheaders = ["bad name=x"]\n', {}, "tracing.headers: 'bad name=x' is not name=value"),
        ('[tracing]\nheaders = ["x-a=1\\r\\nx-b: 2"]\n', {}, "tracing.headers: the value of 'x-a' has a line break"),
        ('[tracing]\nheaders = "x=1"\n', {}, "tracing.headers: expected a list of strings"),
        ('[tracing]\nendpoint = "http://c:4318"\n', {}, "tracing.endpoint: unknown key"),
    ],
)
def test_bad_tracing_values_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], fragment: str
) -> None:
    assert fragment in config_error(tmp_path, text, env)


def test_tracing_settings_from_the_file_and_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[tracing]\notlp_endpoint = "http://collector:4318"\nsample_ratio = 0.25\n')
    env = {"KVSERVE_TRACING_HEADERS": "x-token=abc, x-team = infra", "KVSERVE_TRACING_SERVICE_NAME": "edge"}
    t = load_settings(str(cfg), env=env).tracing
    assert t.enabled and t.sample_ratio == 0.25 and t.service_name == "edge"
    assert t.traces_url == "http://collector:4318/v1/traces"  # a base URL gets OTLP's path
    assert t.header_map() == {"x-token": "abc", "x-team": "infra"}
    assert TracingSection(otlp_endpoint="https://c/otlp/v1/traces").traces_url == "https://c/otlp/v1/traces"
    assert not load_settings(env={}).tracing.enabled  # off by default


def test_a_bad_tracing_value_stops_the_start_with_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[tracing]\notlp_endpoint = "http://127.0.0.1:4318"\nsample_ratio = 2\n')
    run = kvserve("--config", str(cfg))
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "kvserve: configuration error: tracing.sample_ratio: between 0 and 1, got 2.0"
    )


def test_print_config_masks_the_export_headers(tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text('[tracing]\nheaders = ["authorization=Bearer tok-secret"]\n')
    run = kvserve("--print-config", "--config", str(cfg))
    assert run.returncode == 0, run.stderr
    assert "tok-secret" not in run.stdout
    assert json.loads(run.stdout)["tracing"]["headers"] == ["authorization=***"]
