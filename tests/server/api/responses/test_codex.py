"""What Codex CLI (0.171, `codex exec`) sends to /v1/responses, against the fake engine:
its real request bodies (captured, long texts trimmed: codex_requests.json) stream a 200;
hints are accepted and logged; reasoning round-trips through kvserve's sealed
`encrypted_content` (an altered blob is a 400, a foreign one dropped); custom tools come
back as `custom_tool_call` items; namespaced tools are flattened and named back; hosted
tools are left out; the effort sets the template's thinking switch."""

from __future__ import annotations

import base64
import copy
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config.tree import ModelSection, ResponsesSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.helpers import gbnf_match
from tests.server.api.responses.test_responses import named_events, req
from tests.server.api.test_openai_api import MODEL, assert_error

CODEX: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "codex_requests.json").read_text()
)
# A template that shows past thinking (`reasoning_content`) and has a thinking switch.
THINKING = (
    "{%- for m in messages %}<|{{ m.role }}|>"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{\"name\": "
    "\"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
PATCH = '*** Begin Patch\n*** Add File: a.py\n+print("hi")\n*** End Patch\n'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark",
                          "definition": 'start: "*** Begin Patch" LF /(.|\\n)*/\n'
                                        "%import common.LF"}}  # fmt: skip


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=32768)


@pytest.fixture
def thinking(make_client: ClientFactory, fake: FakeEngine) -> httpx.AsyncClient:
    settings = Settings(models=(ModelSection(id="fake-model", chat_template=THINKING),))
    return make_client(fake, settings=settings)


def prompt(fake: FakeEngine, i: int = -1) -> str:
    return bytes(fake.submitted[i].prompt_tokens).decode()


@pytest.mark.parametrize("name", sorted(CODEX))
async def test_codex_request_streams_a_200(
    client: httpx.AsyncClient, fake: FakeEngine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = {**CODEX[name], "model": MODEL}  # (Codex names its own model)
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    events = named_events(r.text)
    assert [n for n, _ in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1][0] == "response.completed"
    assert "prompt_cache_key" in caplog.text  # an accepted hint, logged
    text = prompt(fake)
    assert "web_search" not in text  # a hosted tool: left out
    if name == "codex-default-model-1":  # tools in an additional_tools item, in namespaces
        assert "functions__exec" in text and "collaboration__spawn_agent" in text
        assert "reasoning.context" in caplog.text
    else:
        assert "exec_command" in text and "multi_agent_v1__spawn_agent" in text
    if name == "codex-tool-2":  # the function call and its output, read back
        assert "captured-tool-output" in text and "echo captured-tool-output" in text


async def test_codex_schema_keyword_encrypted(client: httpx.AsyncClient) -> None:
    """Codex marks some strings `"encrypted": true` (its collaboration tools): a keyword
    no JSON Schema vocabulary defines, ignored as llama.cpp ignores it."""
    body = {**CODEX["codex-default-model-1"], "model": MODEL}
    assert '"encrypted": true' in json.dumps(body["input"][0]["tools"][2])
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text


async def test_a_refused_schema_is_named_where_codex_put_it(client: httpx.AsyncClient) -> None:
    body = copy.deepcopy({**CODEX["codex-default-model-1"], "model": MODEL})
    body["input"][0]["tools"][2]["tools"][0]["parameters"]["type"] = "objekt"  # not a type
    r = await client.post("/v1/responses", json=body)
    assert_error(r, 400, "input[0].tools[2].tools[0].parameters")  # not the flat tools[k]


async def test_reasoning_round_trips_sealed(thinking: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = b"<think>The user greets me.</think>Hello!"
    body = req(store=False, include=["reasoning.encrypted_content"],
               reasoning={"effort": "medium", "summary": "auto"})  # fmt: skip
    first = (await thinking.post("/v1/responses", json=body)).json()
    reasoning, message = first["output"]
    assert reasoning["type"] == "reasoning" and message["type"] == "message"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user greets me."}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "The user greets me."}]
    blob = reasoning["encrypted_content"]
    assert blob.startswith("kvs1.") and "greets" not in blob
    turn = [{"role": "user", "content": "Hi"}, reasoning, message,
            {"role": "user", "content": "And now?"}]  # fmt: skip
    r = await thinking.post("/v1/responses", json={**body, "input": turn})
    assert r.status_code == 200, r.text
    assert "<|assistant|><think>The user greets me.</think>Hello!" in prompt(fake)
    # without encrypted_content the item is dropped: its content is the client's copy
    plain = {k: v for k, v in reasoning.items() if k != "encrypted_content"}
    await thinking.post("/v1/responses", json={**body, "input": [turn[0], plain, *turn[2:]]})
    assert "<think>The user greets me." not in prompt(fake)


async def test_stream_has_the_reasoning_events(thinking: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = b"<think>Hmm.</think>Hi"
    body = req(stream=True, include=["reasoning.encrypted_content"], reasoning={"summary": "auto"})
    events = named_events((await thinking.post("/v1/responses", json=body)).text)
    names = [n for n, _ in events]
    for name in ("response.reasoning_text.delta", "response.reasoning_summary_part.added",
                 "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
                 "response.reasoning_summary_part.done", "response.output_text.delta"):  # fmt: skip
        assert name in names, name
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert done[0]["type"] == "reasoning" and done[0]["encrypted_content"].startswith("kvs1.")


async def test_an_altered_blob_is_400_a_foreign_one_dropped(
    thinking: httpx.AsyncClient, make_client: ClientFactory, fake: FakeEngine
) -> None:
    fake.reply = b"<think>Secret plan.</think>Done."
    body = req(store=False, include=["reasoning.encrypted_content"])
    reasoning, message = (await thinking.post("/v1/responses", json=body)).json()["output"]
    head, key, payload, mac = reasoning["encrypted_content"].split(".")
    other = json.dumps({"m": "fake-model", "r": "Injected."}).encode()
    forged = base64.urlsafe_b64encode(other).rstrip(b"=").decode()
    for altered in (f"{head}.{key}.{forged}.{mac}", f"{head}.{key}.{payload}.{mac[:-2]}AA"):
        bad = {**reasoning, "encrypted_content": altered}
        r = await thinking.post("/v1/responses", json={**body, "input": [bad, message]})
        assert assert_error(r, 400, "input[0].encrypted_content")["code"] == (
            "invalid_encrypted_content")  # fmt: skip
    # a blob sealed under another secret (a replica configured apart), or another
    # server's: dropped, the turn runs
    settings = Settings(models=(ModelSection(id="fake-model", chat_template=THINKING),),
                        responses=ResponsesSection(seal_secret="another replica's secret"))  # fmt: skip
    replica = make_client(fake, settings=settings)
    theirs = (await replica.post("/v1/responses", json=body)).json()["output"][0]
    for foreign in (theirs["encrypted_content"], "gAAAAABo-openai-sealed"):
        item = {**reasoning, "encrypted_content": foreign}
        r = await thinking.post("/v1/responses", json={**body, "input": [item, message]})
        assert r.status_code == 200, r.text
        assert "Secret plan." not in prompt(fake)


async def test_custom_tool_call_round_trip(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    call = {"tool_calls": [{"name": "apply_patch", "arguments": {"input": PATCH}}]}
    fake.reply = json.dumps(call).encode()
    body = req(tools=[APPLY_PATCH], store=False)
    (item,) = (await client.post("/v1/responses", json=body)).json()["output"]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert item["input"] == PATCH and item["call_id"] and item["id"].startswith("ctc_")
    seen = prompt(fake)
    assert '"input"' in seen and "lark grammar" in seen  # shown as one string parameter
    events = named_events((await client.post("/v1/responses", json={**body, "stream": True})).text)
    done = [d for n, d in events if n == "response.custom_tool_call_input.done"]
    assert done and done[0]["input"] == PATCH
    fake.reply = b"Patched."
    back = req(tools=[APPLY_PATCH], store=False, input=[
        {"role": "user", "content": "Add a.py"}, item,
        {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "Done!"}])
    r = await client.post("/v1/responses", json=back)
    assert r.status_code == 200, r.text
    text = prompt(fake)
    assert "apply_patch" in text and 'print(\\"hi\\")' in text and "Done!" in text


async def test_custom_tool_input_is_held_to_its_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    """The call grammar the engine gets takes the tool's Lark grammar for the input."""
    def call(text: str) -> str:
        return json.dumps({"tool_calls": [{"name": "apply_patch", "arguments": {"input": text}}]})

    fake.reply = call(PATCH).encode()
    body = req(tools=[APPLY_PATCH], tool_choice="required", store=False)
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    grammar = fake.submitted[0].sampling.grammar
    assert grammar is not None and gbnf_match.accepts(grammar, call(PATCH))
    assert not gbnf_match.accepts(grammar, call("rm -rf /"))  # not a patch


async def test_namespaced_function_is_named_back(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    tools = [{"type": "namespace", "name": "mcp__files", "description": "Files.", "tools": [
        {"type": "function", "name": "read", "description": "Read a file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
        {"type": "web_search"}]  # fmt: skip
    fake.reply = b'{"tool_calls": [{"name": "mcp__files__read", "arguments": {"path": "a"}}]}'
    (item,) = (await client.post("/v1/responses", json=req(tools=tools))).json()["output"]
    assert (item["type"], item["name"], item["namespace"]) == ("function_call", "read", "mcp__files")
    fake.reply = b"ok"
    back = req(tools=tools, input=[{"role": "user", "content": "read a"}, item,
                                   {"type": "function_call_output", "call_id": item["call_id"],
                                    "output": "contents"}])  # fmt: skip
    assert (await client.post("/v1/responses", json=back)).status_code == 200
    assert '"name": "mcp__files__read"' in prompt(fake)


async def test_hosted_tools_are_left_out(
    client: httpx.AsyncClient, fake: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    tools = [{"type": "web_search", "external_web_access": False}, {"type": "file_search"}]
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await client.post("/v1/responses", json=req(tools=tools, tool_choice="auto"))
    assert r.status_code == 200, r.text
    assert "tool_calls" not in prompt(fake)  # no tool is described to the model
    assert fake.submitted[0].sampling.grammar is None
    assert r.json()["tools"] == tools  # the response lists what was asked
    # Each left out with one log line per request (the tools are read once).
    lines = [rec.getMessage() for rec in caplog.records if "left out" in rec.getMessage()]
    assert len(lines) == 2, lines
    assert "tools[0]" in lines[0] and "'web_search'" in lines[0] and "tools[1]" in lines[1]


@pytest.mark.parametrize(("effort", "shown"), [("none", True), ("minimal", True), ("high", False)])
async def test_effort_sets_the_thinking_switch(
    thinking: httpx.AsyncClient, fake: FakeEngine, effort: str, shown: bool
) -> None:
    r = await thinking.post("/v1/responses", json=req(reasoning={"effort": effort}))
    assert r.status_code == 200, r.text
    assert prompt(fake).endswith("<|assistant|><think></think>") is shown
    assert r.json()["reasoning"]["effort"] == effort


async def test_hints_are_accepted(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    body = req(prompt_cache_key="k", safety_identifier="u1", service_tier="flex",
               context_management=[{"type": "compaction", "compact_threshold": 1000}],
               text={"verbosity": "low"}, include=["web_search_call.action.sources"])
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await client.post("/v1/responses", json=copy.deepcopy(body))
    assert r.status_code == 200, r.text
    for hint in ("context_management", "prompt_cache_key", "safety_identifier", "service_tier",
                 "text.verbosity"):  # fmt: skip
        assert hint in caplog.text
