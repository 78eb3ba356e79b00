"""The MCP loop's bounds per request (fake engine, a real MCP server): calls per round
(mcp.max_calls_per_round) and the wall time of its calls (mcp.max_loop_s). A call past
a bound is not run (or is cut) and comes back to the model as an error; once the time
is spent the next round is the last, with no MCP call allowed; settings checked."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config.tree import ConfigError, load_settings
from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp
from tests.helpers.mcp_app import mcp_client, mcp_fixtures, servers
from tests.server.api.test_openai_api import MODEL

NEVER = {"type": "mcp", "server_label": "tools", "require_approval": "never"}

mcp_http, fake, client = mcp_fixtures()


def calls(*pairs: tuple[str, dict[str, Any]]) -> str:
    """One model reply with these calls (parallel calls in one round)."""
    return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in pairs]})


def slow(seconds: float, tag: str) -> tuple[str, dict[str, Any]]:
    return "slow", {"seconds": seconds, "tag": tag}


def mcp_calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in body["output"] if i["type"] == "mcp_call"]


async def test_calls_past_the_bound_of_a_round_are_not_run(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
) -> None:
    tag = f"round-{tmp_path.name}"
    entries = servers(mcp_http.url, tmp_path / "s.log")
    async with mcp_client(fake, entries, max_calls_per_round=2) as client:
        fake.replies = [calls(*[slow(0, f"{tag}-{i}") for i in range(4)]), "Done."]
        r = await client.post("/v1/responses", json={"model": MODEL, "input": "go",
                                                     "tools": [NEVER]})  # fmt: skip
        assert r.status_code == 200, r.text
        made = mcp_calls(r.json())
        assert [c["status"] for c in made] == ["completed", "completed", "failed", "failed"]
        error = made[2]["error"]["content"][0]["text"]
        assert "at most 2 MCP tool calls run per model round (mcp.max_calls_per_round)" in error
        # the server ran two; the model was told about the others
        started = [line for line in mcp_http.lines() if line.startswith(f"start {tag}")]
        assert started == [f"start {tag}-0", f"start {tag}-1"]
        assert "mcp.max_calls_per_round" in bytes(fake.submitted[1].prompt_tokens).decode()
        assert r.json()["output"][-1]["content"][0]["text"] == "Done."


async def test_the_loop_time_cuts_calls_and_ends_the_loop(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
) -> None:
    tag = f"cut-{tmp_path.name}"
    entries = servers(mcp_http.url, tmp_path / "s.log")
    async with mcp_client(fake, entries, max_loop_s=1.0, max_tool_iterations=5) as client:
        # one call that would take 30 s and one after it; the model would call on and on
        fake.replies = [calls(slow(30, tag), slow(0, f"{tag}-next"))]
        fake.reply = calls(slow(0, f"{tag}-more")).encode()
        began = time.monotonic()
        r = await client.post("/v1/responses", json={"model": MODEL, "input": "go",
                                                     "tools": [NEVER], "tool_choice": "required"})
        took = time.monotonic() - began
        assert r.status_code == 200, r.text
        assert took < 5, took  # not 30 s (the call's timeout_s), nor 5 rounds of calls
        first, second = mcp_calls(r.json())
        assert "was cut off: the request's time for MCP tool calls (mcp.max_loop_s)" in (
            first["error"]["content"][0]["text"])
        assert "not run: the request's time for MCP tool calls (1 s, mcp.max_loop_s) ran out" in (
            second["error"]["content"][0]["text"])
        # the next round was the last: no MCP call allowed, although 4 rounds were left
        assert len(fake.submitted) == 2
        assert fake.submitted[0].sampling.grammar is not None
        assert fake.submitted[-1].sampling.grammar is None
        assert r.json()["output"][-1]["type"] == "message"
    lines = mcp_http.lines()
    assert f"cancelled {tag}" in lines and f"start {tag}-next" not in lines


async def test_the_chat_route_reports_the_cut_call(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
) -> None:
    entries = servers(mcp_http.url, tmp_path / "s.log")
    async with mcp_client(fake, entries, max_loop_s=0.5) as client:
        fake.replies = [calls(slow(30, f"chat-{tmp_path.name}")), "Out of time."]
        r = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "mcp", "server_label": "tools"}]})  # fmt: skip
        assert r.status_code == 200, r.text
        (report,) = r.json()["kvserve_mcp"]["calls"]
        assert report["output"] is None and "mcp.max_loop_s" in report["error"]
        assert r.json()["choices"][0]["message"]["content"] == "Out of time."


@pytest.mark.parametrize(("line", "message"), [
    ("max_loop_s = 0", "mcp.max_loop_s: must be above 0"),
    ("max_calls_per_round = 0", "mcp.max_calls_per_round: between 1 and 128"),
    ("max_private_connections = 0", "mcp.max_private_connections: at least 1"),
    ("connect_retry_s = -1", "mcp.connect_retry_s: must be 0 or more"),
    ("max_loop_s = \"long\"", "mcp.max_loop_s"),
])  # fmt: skip
def test_bad_bounds_stop_the_start(tmp_path: Path, line: str, message: str) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(f"[mcp]\n{line}\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(str(cfg), env={})


def test_the_bounds_have_defaults_in_the_example_config() -> None:
    example = (Path(__file__).parents[3] / "config.example.toml").read_text()
    settings = load_settings(None, env={}).mcp
    for key in ("connect_retry_s", "max_loop_s", "max_calls_per_round",
                "max_private_connections"):  # fmt: skip
        value = getattr(settings, key)
        assert f"\n{key} = {value}" in example, key


async def test_bounds_leave_a_plain_request_alone(client: httpx.AsyncClient,
                                                  fake: FakeEngine) -> None:  # fmt: skip
    fake.replies = [calls(("add", {"a": 1, "b": 2})), "3"]
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "1 + 2?",
                                                 "tools": [NEVER]})  # fmt: skip
    assert [c["output"] for c in mcp_calls(r.json())] == ["3"]
