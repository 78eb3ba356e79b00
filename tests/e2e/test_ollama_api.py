"""Ollama's inference routes through the real `ollama` client against the real server
process and model: show, chat (plain, streamed, schema, tools), generate with `context`
continuing on the warm KV, embeddings, keep_alive unload and reload, preload, errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import ollama
import pytest

from tests.e2e.shared import keyed_server

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-ollama"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAST = {"num_predict": 8, "temperature": 0}
CITY = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 16}},
        "required": ["capital"], "additionalProperties": False}  # fmt: skip
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}  # fmt: skip


server = keyed_server(KEY, admin=True)  # keep_alive 0 and -1 are model management


@pytest.fixture
def client(server: str) -> Iterator[ollama.Client]:
    c = ollama.Client(host=server, headers=AUTH)
    yield c
    c._client.close()


def state(server: str) -> str:
    r = httpx.get(f"{server}/v1/models/{MODEL}", headers=AUTH, timeout=10)
    return str(r.json()["meta"]["state"])


def wait_state(server: str, wanted: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while state(server) != wanted:
        assert time.monotonic() < deadline, f"the model did not become {wanted}"
        time.sleep(0.2)


def test_show(client: ollama.Client) -> None:
    r = client.show(f"{MODEL}:latest")
    assert r.details is not None and r.details.family == "llama"
    assert r.details.parameter_size == "134.52M" and r.details.quantization_level == "Q4_1"
    assert r.modelinfo is not None and r.modelinfo["llama.context_length"] == 8192
    assert r.capabilities == ["completion", "tools", "embedding"]
    assert r.template and "<|im_start|>" in r.template


def test_chat_plain_and_streamed(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat(model=MODEL, messages=messages, options=FAST)
    assert plain.done and plain.done_reason in ("stop", "length") and plain.message.content
    assert plain.eval_count and 0 < plain.eval_count <= 8
    assert plain.prompt_eval_duration and plain.eval_duration and plain.total_duration
    assert plain.total_duration >= plain.eval_duration
    parts = list(client.chat(model=MODEL, messages=messages, options=FAST, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == plain.message.content


def test_chat_with_a_schema(client: ollama.Client) -> None:
    r = client.chat(model=MODEL, format=CITY, options={"num_predict": 40, "temperature": 0},
                    messages=[{"role": "user", "content": "The capital of France, as JSON."}])
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content or ""), CITY)


def test_chat_with_tools_and_their_results(client: ollama.Client) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 degrees."},
    ]  # fmt: skip
    r = client.chat(model=MODEL, messages=messages, tools=[WEATHER],
                    options={"num_predict": 40, "temperature": 0})  # fmt: skip
    assert r.done
    for call in r.message.tool_calls or []:  # whatever the small model chose: well formed
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    assert r.message.content or r.message.tool_calls


def test_generate_context_reuses_the_warm_kv(client: ollama.Client) -> None:
    head = "Here is a story about a lighthouse keeper who lived alone by the sea. " * 4
    first = client.generate(model=MODEL, prompt=head + "Who is it about?", options=FAST)
    assert first.context and first.eval_count
    prompt = len(first.context) - first.eval_count
    assert first.prompt_eval_count is not None and first.prompt_eval_count <= prompt
    second = client.generate(model=MODEL, prompt="And where?", context=first.context,
                             options=FAST)  # fmt: skip
    assert second.context and second.context[: len(first.context)] == list(first.context)
    assert second.eval_count
    # eval_count counts an end-of-generation token that `context` does not hold: a reply
    # that ended on one ("stop": no stop strings here) holds one token fewer.
    prompt2 = len(second.context) - second.eval_count + (second.done_reason == "stop")
    reused = prompt2 - (second.prompt_eval_count or 0)
    # Everything the first answer holds in the KV (all but its last sampled token), less
    # the warm tail the server computes again (/api/show says how many rows at most: a
    # flash tile where short warm chunks are padded to one).
    shown = client.show(MODEL).modelinfo or {}
    tail = shown["kvserve.warm_start_rows"]
    assert tail in (1, 64) and prompt2 >= 2 * 64
    assert reused >= len(first.context) - tail, (reused, len(first.context))
    assert second.prompt_eval_count and second.prompt_eval_count < prompt2 - len(head) // 8


def test_raw_generate(client: ollama.Client) -> None:
    r = client.generate(model=MODEL, raw=True, options=FAST,
                        prompt="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert r.done and r.response


def test_embed_and_embeddings(client: ollama.Client) -> None:
    r = client.embed(model=MODEL, input=["a cat", "a dog"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    assert r.prompt_eval_count and r.prompt_eval_count >= 4
    short = client.embed(model=MODEL, input="a cat", dimensions=32)
    assert len(short.embeddings[0]) == 32
    legacy = client.embeddings(model=MODEL, prompt="a cat")
    assert legacy.embedding == pytest.approx(r.embeddings[0], abs=1e-5)


def test_errors(client: ollama.Client, server: str) -> None:
    # A single-model server answers any name on inference routes (as llama-server does:
    # [model_names] any_with_one_model); model management still names models exactly.
    with pytest.raises(ollama.ResponseError) as err:
        client.show("nope")
    assert err.value.status_code == 404 and "nope" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model=MODEL, prompt="x", options={"num_gpu": 1})
    assert err.value.status_code == 400 and "options.num_gpu" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model=MODEL, prompt="x", options={"num_ctx": 100_000})
    assert err.value.status_code == 400 and "options.num_ctx" in err.value.error
    anonymous = ollama.Client(host=server)
    with pytest.raises(ollama.ResponseError) as err:
        anonymous.show(MODEL)
    assert err.value.status_code == 401
    anonymous._client.close()


def test_keep_alive_unloads_and_preload_reloads(client: ollama.Client, server: str) -> None:
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options=FAST,
                    keep_alive=0)  # fmt: skip
    assert r.done and r.message.content
    wait_state(server, "unloaded")
    again = client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                        options=FAST)  # fmt: skip  (loads it again; no keep_alive: stays)
    assert again.done and again.load_duration and again.load_duration > 1_000_000
    assert state(server) == "loaded"
    unload = client.generate(model=MODEL, keep_alive=0)
    assert unload.done_reason == "unload"
    wait_state(server, "unloaded")
    preload = client.generate(model=MODEL, keep_alive="10m")
    assert preload.done_reason == "load" and state(server) == "loaded"
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    time.sleep(1.0)  # past the idle unloader's next look: a 10 minute keep_alive holds
    assert state(server) == "loaded"
