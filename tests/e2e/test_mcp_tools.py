"""MCP tools run by the server, through the real clients (openai, anthropic) against the
real server process and model and a real MCP server (the SDK's, on streamable HTTP and on
stdio). The small model does not call tools reliably by itself, so calls are forced
(tool_choice): the grammar makes them valid calls."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.helpers.mcp.servers import HttpMcp, http_mcp, stdio_command
from tests.kvserve_process import running

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-mcp"
SYSTEM = "You are a careful assistant that uses tools to do arithmetic. " * 4
# (one call per round: with parallel calls allowed, greedy decoding repeats the call)


@pytest.fixture(scope="module")
def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpMcp]:
    with http_mcp(tmp_path_factory.mktemp("mcp")) as server:
        yield server


@pytest.fixture(scope="module")
def server(mcp_http: HttpMcp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("kvserve-mcp")
    command, args = stdio_command(tmp / "stdio.log")
    config = tmp / "kvserve.toml"
    config.write_text(
        "[mcp]\nmax_tool_iterations = 2\nmax_result_chars = 2000\n\n"
        f'[[mcp_servers]]\nlabel = "tools"\nurl = "{mcp_http.url}"\ntimeout_s = 30.0\n\n'
        f'[[mcp_servers]]\nlabel = "local"\ncommand = {json.dumps(command)}\n'
        f"args = {json.dumps(list(args))}\n"
    )
    with running(["--config", str(config), "--api-key", KEY, "--parallel", "2"], tmp) as s:
        yield s.url


@pytest.fixture
def oai(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
        yield client


def tool(**extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "tools", "require_approval": "never", **extra}


ARGS: dict[str, Any] = dict(model=MODEL, instructions=SYSTEM, input="What is 2 plus 3?",
                            temperature=0, max_output_tokens=200, store=False,
                            parallel_tool_calls=False)  # fmt: skip
FORCE_ADD = {"type": "mcp", "server_label": "tools", "name": "add"}


def test_responses_forced_call_on_warm_kv(oai: openai.OpenAI, mcp_http: HttpMcp) -> None:
    r = oai.responses.create(**ARGS, tools=[tool(server_url=mcp_http.url)],
                             tool_choice=FORCE_ADD)  # type: ignore[arg-type]
    assert r.status in ("completed", "incomplete"), r
    kinds = [item.type for item in r.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"] and kinds[-1] == "message"
    called = r.output[1]
    assert called.type == "mcp_call" and called.name == "add" and called.server_label == "tools"
    args = json.loads(called.arguments)
    assert called.error is None and called.output == str(args["a"] + args["b"])
    usage = r.usage
    assert usage is not None
    # two rounds; the second continued on the first one's KV
    assert usage.input_tokens_details.cached_tokens > usage.input_tokens * 0.3, usage


def test_responses_streamed(oai: openai.OpenAI) -> None:
    with oai.responses.stream(**ARGS, tools=[tool()],
                              tool_choice="required") as stream:  # type: ignore[arg-type]
        names = [event.type for event in stream]
        final = stream.get_final_response()
    for name in ("response.mcp_list_tools.completed", "response.mcp_call_arguments.done",
                 "response.mcp_call.in_progress", "response.mcp_call.completed"):
        assert name in names, names
    assert names.index("response.mcp_call.completed") < names.index("response.completed")
    assert [i.type for i in final.output][:2] == ["mcp_list_tools", "mcp_call"]


def test_responses_stdio_server(oai: openai.OpenAI) -> None:
    r = oai.responses.create(**ARGS, tools=[{"type": "mcp", "server_label": "local",
                                              "require_approval": "never",
                                              "allowed_tools": ["echo"]}],
                             tool_choice="required")  # type: ignore[arg-type, list-item]
    called = r.output[1]
    assert called.type == "mcp_call" and called.name == "echo"
    assert called.output == json.loads(called.arguments)["text"]


def test_approval_round_trip(oai: openai.OpenAI) -> None:
    args = {**ARGS, "store": True}
    first = oai.responses.create(**args, tools=[tool(require_approval="always")],
                                 tool_choice=FORCE_ADD)  # type: ignore[arg-type]
    asked = first.output[-1]
    assert asked.type == "mcp_approval_request" and asked.name == "add"
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, max_output_tokens=200, temperature=0,
        parallel_tool_calls=False,
        tools=[tool(require_approval="always")],  # type: ignore[list-item]
        input=[{"type": "mcp_approval_response", "approval_request_id": asked.id,
                "approve": True}],  # type: ignore[list-item]
    )  # fmt: skip
    called = second.output[1]
    assert called.type == "mcp_call" and called.approval_request_id == asked.id
    assert called.output is not None and second.output[-1].type == "message"


def test_unconfigured_server_url_is_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(**ARGS, tools=[tool(server_url="http://127.0.0.1:9/mcp")])  # type: ignore[list-item]
    assert "tools[0].server_url" in str(caught.value)


def test_chat_completions_extension(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=200, parallel_tool_calls=False,
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=[tool()],  # type: ignore[list-item]
        tool_choice=FORCE_ADD,  # type: ignore[arg-type]
    )  # fmt: skip
    report = (r.model_extra or {})["kvserve_mcp"]
    (done,) = report["calls"]
    assert done["name"] == "add" and done["error"] is None
    assert r.choices[0].message.content is not None and report["rounds"] == 2
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_mcp_connector(server: str, mcp_http: HttpMcp) -> None:
    with anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0) as claude:
        args: dict[str, Any] = dict(
            model=MODEL, max_tokens=200, betas=["mcp-client-2025-04-04"],
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Add 2 and 3."}],
            mcp_servers=[{"type": "url", "url": mcp_http.url, "name": "calc",
                          "tool_configuration": {"allowed_tools": ["add"]}}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )  # fmt: skip
        message = claude.beta.messages.create(**args)
        kinds = [b.type for b in message.content]
        assert kinds[:2] == ["mcp_tool_use", "mcp_tool_result"], kinds
        use, result = message.content[0], message.content[1]
        assert use.name == "add" and use.server_name == "calc"  # type: ignore[union-attr]
        assert result.tool_use_id == use.id and not result.is_error  # type: ignore[union-attr]
        assert message.usage.cache_read_input_tokens
        with claude.beta.messages.stream(**args) as stream:
            streamed = stream.get_final_message()
        assert [b.type for b in streamed.content][:2] == ["mcp_tool_use", "mcp_tool_result"]


def test_disconnect_mid_call_cancels_it(server: str, mcp_http: HttpMcp) -> None:
    body = {**ARGS, "tools": [tool()], "stream": True,
            "tool_choice": {"type": "mcp", "server_label": "tools", "name": "stall"}}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=120) as client, client.stream(
        "POST", f"{server}/v1/responses", json=body, headers=headers
    ) as response:
        for line in response.iter_lines():
            if "response.mcp_call.in_progress" in line:
                break
        deadline = time.monotonic() + 30
        while "start stall" not in mcp_http.lines() and time.monotonic() < deadline:
            time.sleep(0.1)
    deadline = time.monotonic() + 30
    while "cancelled stall" not in mcp_http.lines() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "cancelled stall" in mcp_http.lines() and "done stall" not in mcp_http.lines()
    # and the server goes on serving
    with httpx.Client(timeout=120) as client:
        r = client.post(f"{server}/v1/responses", headers=headers,
                        json={**ARGS, "tools": [tool()], "tool_choice": FORCE_ADD})  # fmt: skip
        assert r.status_code == 200 and r.json()["output"][1]["status"] == "completed"
