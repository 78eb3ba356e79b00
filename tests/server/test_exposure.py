"""What the server shows of itself (issue 28, item 15): `--print-config` masks every
credential, the model's file path in /api/show is for admin callers only, and the
API's description (/openapi.json, /docs, /redoc) takes a key when keys are configured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.cli.main import main
from server.config.mask import mask_command, mask_text, masked
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

SECRETS = ("r3dis-pass", "otel-pass", "hc-secret", "mcp-secret", "hdr-secret", "cmd-secret",
           "arg-secret", "pw-secret", "sk-a", "sk-admin", "q-pass")  # fmt: skip
CONFIG = """
[cache]
shared_url = "redis://:r3dis-pass@redis.internal:6379/0"
[tracing]
otlp_endpoint = "https://otel-user:otel-pass@collector:4318"
headers = ["x-honeycomb-team=hc-secret"]
[auth]
api_keys = ["sk-a"]
admin_api_keys = ["sk-admin"]
[[mcp_servers]]
label = "gh"
url = "https://mcp.example/mcp?access_token=mcp-secret&v=2"
headers = {Authorization = "Bearer hdr-secret"}
api_keys = ["sk-a"]
[[mcp_servers]]
label = "local"
command = "python -m tool --api-key cmd-secret"
args = ["--token", "arg-secret", "--password=pw-secret", "--name", "n"]
[[mcp_servers]]
label = "q"
url = "http://user@mcp.internal/x?password=q-pass"
"""


def test_print_config_masks_every_credential(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(CONFIG)
    assert main(["--print-config", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert [s for s in SECRETS if s in out] == []
    shown = json.loads(out)
    # ... and what is not secret is still there to read.
    assert shown["cache"]["shared_url"] == "redis://:***@redis.internal:6379/0"
    assert shown["tracing"]["otlp_endpoint"] == "https://otel-user:***@collector:4318"
    assert shown["tracing"]["headers"] == ["x-honeycomb-team=***"]
    gh, local, q = shown["mcp_servers"]
    assert gh["url"] == "https://mcp.example/mcp?access_token=***&v=2"
    assert gh["headers"] == {"Authorization": "***"} and gh["api_keys"] == ["***"]
    assert local["command"] == "python -m tool --api-key ***"
    assert local["args"] == ["--token", "***", "--password=***", "--name", "n"]
    assert q["url"] == "http://***@mcp.internal/x?password=***"
    assert shown["auth"] == {"api_keys": ["***"], "admin_api_keys": ["***"]}


@pytest.mark.parametrize(
    "text,shown",
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("rediss://u:p@h:1/2", "rediss://u:***@h:1/2"),
        ("unix://:pw@/run/redis.sock", "unix://:***@/run/redis.sock"),
        ("https://tok@h/v1/traces", "https://***@h/v1/traces"),
        ("http://h/x?sig=abc&page=2", "http://h/x?sig=***&page=2"),
        ("http://h/x?a=1", "http://h/x?a=1"),
        ("/models/my-model.gguf", "/models/my-model.gguf"),
    ],
)
def test_urls_lose_their_credentials_only(text: str, shown: str) -> None:
    assert mask_text(text) == shown


def test_command_lines_and_secret_keys() -> None:
    assert mask_command("env GITHUB_TOKEN=ghp_x srv --port 3") == "env GITHUB_TOKEN=*** srv --port 3"
    assert masked({"bearer_token_env": "GH_TOKEN"}) == {"bearer_token_env": "GH_TOKEN"}
    assert masked({"password": "p", "block_tokens": 16, "max_tokens": 5}) == {
        "password": "***", "block_tokens": 16, "max_tokens": 5}  # fmt: skip
    # A chat template is not a command line: its words stay as they are.
    assert masked({"chat_template": "{{ bos_token }} x"}) == {"chat_template": "{{ bos_token }} x"}


async def test_show_names_the_model_file_to_admin_callers_only(make_client: ClientFactory) -> None:
    body = {"model": "fake-model"}
    keyed = make_client(FakeEngine(), api_keys=("user",), admin_api_keys=("admin",))
    r = await keyed.post("/api/show", json=body, headers={"Authorization": "Bearer user"})
    assert r.status_code == 200
    assert "/nonexistent/fake.gguf" not in r.text
    assert r.json()["modelfile"] == "# Served by kvserve\nFROM fake-model\n"
    r = await keyed.post("/api/show", json=body, headers={"Authorization": "Bearer admin"})
    assert r.json()["modelfile"] == "# Served by kvserve\nFROM /nonexistent/fake.gguf\n"
    open_server = make_client(FakeEngine())  # no keys: the one caller is the admin
    r = await open_server.post("/api/show", json=body)
    assert "FROM /nonexistent/fake.gguf" in r.json()["modelfile"]


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
async def test_the_api_description_takes_a_key_when_keys_are_set(
    make_client: ClientFactory, path: str
) -> None:
    keyed = make_client(FakeEngine(), api_keys=("user",), admin_api_keys=("admin",))
    r = await keyed.get(path)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert (await keyed.get(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
    for key in ("user", "admin"):  # any key
        assert (await keyed.get(path, headers={"Authorization": f"Bearer {key}"})).is_success
    assert (await make_client(FakeEngine()).get(path)).status_code == 200  # no keys: open


async def test_the_described_api_is_the_whole_api(make_client: ClientFactory) -> None:
    r = await make_client(FakeEngine()).get("/openapi.json")
    paths = r.json()["paths"]
    assert {"/v1/chat/completions", "/api/pull", "/v1/models/{model_id}/unload"} <= set(paths)
    assert not {"/openapi.json", "/docs", "/redoc"} & set(paths)
    assert (await make_client(FakeEngine()).get("/docs/oauth2-redirect")).status_code == 404
