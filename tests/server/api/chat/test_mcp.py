"""Chat Completions with `{"type": "mcp"}` tools (kvserve's extension) on the fake engine
against a real MCP server: the answer in `message`, the calls in `kvserve_mcp`."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.mcp_app import call, mcp_fixtures
from tests.server.api.test_images import DATA_URL, PNG
from tests.server.api.test_openai_api import MODEL
from tests.server.telemetry.test_tracing import REQUEST, run_python

ADD = call("add", '{"a": 20, "b": 22}')
MCP = {"type": "mcp", "server_label": "tools"}
FORCE = {"type": "mcp", "server_label": "tools", "name": "add"}


mcp_http, fake, client = mcp_fixtures()


def req(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "20 + 22?"}],
            "tools": [MCP], **extra}  # fmt: skip


async def test_the_answer_in_message_the_calls_in_kvserve_mcp(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.replies = [ADD, "It is 42."]
    r = await client.post("/v1/chat/completions", json=req(tool_choice=FORCE))
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    assert choice["message"]["content"] == "It is 42." and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    report = body["kvserve_mcp"]
    assert report["rounds"] == 2
    (listed,) = report["tools"]
    assert listed["server_label"] == "tools" and "add" in listed["tools"]
    (done,) = report["calls"]
    assert (done["name"], done["output"], done["error"]) == ("add", "42", None)
    assert json.loads(done["arguments"]) == {"a": 20, "b": 22}
    first, second = fake.submitted
    assert first.session_id == second.session_id and first.session_id.startswith("mcp_loop_")
    assert body["usage"]["prompt_tokens"] == len(first.prompt_tokens) + len(second.prompt_tokens)


async def test_a_named_session_carries_the_loop(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [ADD, "42"]
    r = await client.post("/v1/chat/completions", json=req(tool_choice=FORCE),
                          headers={"X-Kvserve-Session": "mine"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [s.session_id for s in fake.submitted] == ["mine", "mine"]


async def test_stream(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [ADD, "Forty-two."]
    r = await client.post("/v1/chat/completions", json=req(
        tool_choice=FORCE, stream=True, stream_options={"include_usage": True}))
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    reports = [c["kvserve_mcp"] for c in chunks if "kvserve_mcp" in c]
    assert "tools" in reports[0] and reports[1]["call"]["output"] == "42"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Forty-two."
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{**MCP, "require_approval": "always"}]}, "tools[0].require_approval"),
    ({"tools": [{**MCP, "server_url": "http://127.0.0.2:9/mcp"}]}, "tools[0].server_url"),
    ({"tools": [{"type": "mcp", "server_label": "nope"}]}, "tools[0].server_label"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"tool_choice": {"type": "mcp", "server_label": "local"}}, "tool_choice.server_label"),
])  # fmt: skip
async def test_bad_input_is_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, extra: dict[str, Any], param: str
) -> None:
    r = await client.post("/v1/chat/completions", json=req(**extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert fake.submitted == []


def test_no_mcp_servers_loads_no_mcp_sdk() -> None:
    """The SDK costs about a second at start-up (a third of kvserve's imports): with no
    `[[mcp_servers]]` a request through the whole app never loads it. (The tests above,
    with a server configured, load it on first use.)"""
    loaded = REQUEST + """
import sys
print(sorted(m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types")
             or m == "server.mcp.connection"))
"""
    assert run_python(loaded) == "[]"


async def test_an_image_is_read_once_and_stays_in_every_round(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake._info = replace(fake.info, vision=True, media_marker="<__media__>")
    fake.replies = [ADD, "It is 42."]
    body = req(tool_choice=FORCE)
    body["messages"] = [{"role": "user", "content": [
        {"type": "text", "text": "The sum on this board?"},
        {"type": "image_url", "image_url": {"url": DATA_URL}}]}]  # fmt: skip
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    first, second = fake.submitted
    assert [m.data for m in first.media] == [PNG] and second.media == first.media
    image = [t for t in first.prompt_tokens if t < 0]
    assert image and [t for t in second.prompt_tokens if t < 0] == image
