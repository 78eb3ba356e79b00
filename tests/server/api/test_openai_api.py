"""The HTTP surface against the fake engine: shapes, SSE framing, errors."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import numpy as np
import pytest

from server.config.tree import LoadingSection, ModelNamesSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

MODEL = "fake-model"
REPLY = "Hello from the fake engine."


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **extra}


def sse_events(body: str) -> list[str]:
    """The data payloads of an SSE body, checking the framing on the way."""
    assert body.endswith("\n\n")
    events = []
    for block in body.strip("\n").split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        events.append(lines[0][len("data: ") :])
    return events


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error  # type: ignore[no-any-return]


# -- chat ------------------------------------------------------------------------------


async def test_chat_completion_shape(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == REPLY
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None
    usage = body["usage"]
    prompt_tokens = len(fake.submitted[0].prompt_tokens)
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == len(REPLY) + 1  # the EOS token counts
    assert usage["total_tokens"] == prompt_tokens + len(REPLY) + 1
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_chat_prompt_is_rendered_with_template(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    await client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
            ],
        },
    )
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_chat_max_tokens_and_stop(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.post("/v1/chat/completions", json=chat(max_tokens=5))
    assert r.json()["choices"][0]["message"]["content"] == REPLY[:5]
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = await client.post("/v1/chat/completions", json=chat(max_completion_tokens=3))
    assert r.json()["choices"][0]["message"]["content"] == REPLY[:3]
    r = await client.post("/v1/chat/completions", json=chat(stop=["fake", "from"]))
    assert r.json()["choices"][0]["message"]["content"] == "Hello "
    assert r.json()["choices"][0]["finish_reason"] == "stop"


async def test_chat_sampling_fields_reach_the_engine(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    await client.post(
        "/v1/chat/completions",
        json=chat(
            temperature=0.3,
            top_p=0.9,
            top_k=7,
            min_p=0.05,
            seed=42,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repeat_penalty=1.1,
            logit_bias={"65": 5.0},
            mirostat=2,
            dry_multiplier=0.8,
            xtc_probability=0.5,
            top_n_sigma=1.5,
            dynatemp_range=0.2,
            ignore_eos=True,
            grammar='root ::= "a"',
            typical_p=0.95,
        ),
    )
    s = fake.submitted[0].sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.3, 0.9, 7, 0.05, 42)
    assert (s.presence_penalty, s.frequency_penalty, s.repeat_penalty) == (0.5, -0.5, 1.1)
    assert s.logit_bias == ((65, 5.0),)
    assert (s.mirostat, s.dry_multiplier, s.xtc_probability, s.top_n_sigma) == (2, 0.8, 0.5, 1.5)
    assert (s.dynatemp_range, s.ignore_eos, s.grammar, s.typical_p) == (
        0.2,
        True,
        'root ::= "a"',
        0.95,
    )


async def test_chat_n_choices_get_distinct_seeds(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/chat/completions", json=chat(n=3, seed=10))
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == REPLY for c in body["choices"])
    assert [q.sampling.seed for q in fake.submitted] == [10, 11, 12]
    assert body["usage"]["completion_tokens"] == 3 * (len(REPLY) + 1)
    assert body["usage"]["prompt_tokens"] == len(fake.submitted[0].prompt_tokens)


async def test_chat_logprobs_shape(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=chat(logprobs=True, top_logprobs=2, max_tokens=3)
    )
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["H", "e", "l"]
    for entry in content:
        assert entry["logprob"] <= 0
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}


async def test_chat_stream_framing(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1] if c["choices"])
    assert text == REPLY
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(REPLY) + 1
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_chat_stream_without_usage_has_no_usage_field(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    assert all("usage" not in c for c in chunks)


async def test_chat_stream_n2_interleaves_both_choices(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(stream=True, n=2))
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
    assert texts == {0: REPLY, 1: REPLY}


async def test_stream_error_midway_is_an_error_event(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    events = sse_events(r.text)
    error = json.loads(events[-1])["error"]
    assert error["type"] == "server_error"
    assert "llama_decode failed" in error["message"]


async def test_failed_generation_is_500_naming_the_cause(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    r = await client.post("/v1/chat/completions", json=chat())
    error = assert_error(r, 500)
    assert "llama_decode failed with code -3" in error["message"]
    r = await client.post("/v1/chat/completions", json=chat())  # and the next one is served
    assert r.status_code == 200


# -- completions -----------------------------------------------------------------------


async def test_completion_shapes_for_every_prompt_form(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    for prompt, count in [("Once", 1), (["a", "b"], 2), ([72, 105], 1), ([[72], [105, 33]], 2)]:
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert [c["index"] for c in body["choices"]] == list(range(count))
        assert all(
            c["text"] == REPLY[:4] and c["finish_reason"] == "length" for c in body["choices"]
        )
    assert fake.submitted[-1].prompt_tokens == (105, 33)


async def test_completion_default_max_tokens_is_16(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert fake.submitted[0].max_tokens == 16


async def test_completion_echo_and_logprobs(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi", "echo": True, "max_tokens": 3}
    )
    assert r.json()["choices"][0]["text"] == "Hi" + REPLY[:3]
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi", "logprobs": 2, "max_tokens": 3}
    )
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["H", "e", "l"]
    assert lp["text_offset"] == [0, 1, 2]
    assert all(v <= 0 for v in lp["token_logprobs"])
    assert all(len(t) == 2 for t in lp["top_logprobs"])


async def test_completion_stream_with_two_prompts(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": ["a", "b"],
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: REPLY[:5], 1: REPLY[:5]}
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert chunks[-1]["usage"]["prompt_tokens"] == 2


# -- embeddings, models, tokenize, health --------------------------------------------


async def test_embeddings_float_and_base64(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["one", "two"]})
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    vec = np.array(body["data"][0]["embedding"])
    assert vec.shape == (8,) and abs(np.linalg.norm(vec) - 1) < 1e-5
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    r = await client.post(
        "/v1/embeddings",
        json={"model": MODEL, "input": "one", "encoding_format": "base64", "dimensions": 4},
    )
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert raw.shape == (4,) and abs(np.linalg.norm(raw) - 1) < 1e-5
    np.testing.assert_allclose(raw, vec[:4] / np.linalg.norm(vec[:4]), rtol=1e-5)


async def test_models_list_and_retrieve(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models")
    assert r.json()["object"] == "list" and r.json()["data"][0]["id"] == MODEL
    assert r.json()["data"][0]["object"] == "model"
    r = await client.get(f"/v1/models/{MODEL}")
    assert r.json()["id"] == MODEL
    assert_error(await client.get("/v1/models/gpt-4"), 404, "model")


async def test_tokenize_roundtrip(client: httpx.AsyncClient) -> None:
    r = await client.post("/tokenize", json={"content": "Hi!"})
    assert r.json() == {"tokens": [72, 105, 33]}
    r = await client.post("/tokenize", json={"content": "Hi", "with_pieces": True})
    assert r.json() == {"tokens": [{"id": 72, "piece": "H"}, {"id": 105, "piece": "i"}]}
    r = await client.post("/detokenize", json={"tokens": [72, 105, 33]})
    assert r.json() == {"content": "Hi!"}
    assert_error(await client.post("/detokenize", json={"tokens": [99999]}), 400, "tokens")
    assert_error(await client.post("/detokenize", json={"tokens": [-1]}), 400)


async def test_health_loading_then_ready(make_client: ClientFactory) -> None:
    engine = FakeEngine(ready=False)
    # it stays loading until the test says: a request waits wait_s for it, then 503
    c = make_client(engine, settings=Settings(loading=LoadingSection(wait_s=0.2)))
    r = await c.get("/health")
    assert r.status_code == 503
    assert r.json() == {
        "status": "loading",
        "progress": 0.25,
        "models": {MODEL: {"status": "loading", "progress": 0.25}},
    }
    assert (await c.get("/livez")).status_code == 200
    assert_error(await c.post("/v1/chat/completions", json=chat()), 503)
    engine.state = engine.state.__class__.READY
    assert (await c.get("/health")).json() == {"status": "ok", "models": {MODEL: {"status": "ready"}}}


# -- auth, limits, CORS ----------------------------------------------------------------


async def test_api_key_required_when_configured(
    make_client: ClientFactory, fake: FakeEngine
) -> None:
    c = make_client(fake, api_keys=("sk-one", "sk-two"))
    assert_error(await c.get("/v1/models"), 401)
    assert_error(await c.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
    assert_error(await c.get("/v1/models", headers={"Authorization": "Basic sk-one"}), 401)
    assert (
        await c.get("/v1/models", headers={"Authorization": "Bearer sk-two"})
    ).status_code == 200
    assert (await c.get("/health")).status_code == 200  # health stays public
    assert (await c.get("/livez")).status_code == 200


async def test_body_too_large_is_413(make_client: ClientFactory, fake: FakeEngine) -> None:
    c = make_client(fake, max_body_bytes=2048)
    big = chat(messages=[{"role": "user", "content": "x" * 5000}])
    assert_error(await c.post("/v1/chat/completions", json=big), 413)
    assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200


async def test_queue_full_is_429_with_retry_after(make_client: ClientFactory) -> None:
    engine = FakeEngine(n_seq_max=1, max_queue=1)
    engine.outstanding = 2  # as if two requests were in flight
    c = make_client(engine)
    r = await c.post("/v1/chat/completions", json=chat())
    assert_error(r, 429)
    assert r.headers["retry-after"] == "1"


async def test_cors_off_by_default_and_configurable(
    make_client: ClientFactory, fake: FakeEngine
) -> None:
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    off = make_client(fake)
    r = await off.options("/v1/chat/completions", headers=headers)
    assert "access-control-allow-origin" not in r.headers
    on = make_client(fake, cors_origins=("https://app.example",))
    r = await on.options("/v1/chat/completions", headers=headers)
    assert r.headers["access-control-allow-origin"] == "https://app.example"


# -- bad input -------------------------------------------------------------------------

BAD_CHAT = [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
    (chat(temperature=3), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(top_p=1.5), "top_p"),
    (chat(n=0), "n"),
    (chat(n=99), "n"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=-5), "max_tokens"),
    (chat(presence_penalty=9), "presence_penalty"),
    (chat(frequency_penalty=-9), "frequency_penalty"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    (chat(logit_bias={"abc": 1}), "logit_bias"),
    (chat(logit_bias={"99999": 1}), "logit_bias"),
    (chat(logit_bias={"5": 500}), "logit_bias.5"),
    (chat(stop=[""]), "stop"),
    (chat(stop=["s"] * 17), "stop"),
    (chat(mirostat=5), "mirostat"),
    (chat(stream="yes please"), "stream"),
    (chat(functions=[{"name": "f"}]), "functions"),
    (chat(store=True), "store"),
    (chat(modalities=["text", "audio"]), "modalities"),
    (chat(grammar="this is not gbnf"), "grammar"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0].image_url",
    ),
    (
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        "messages[0].tool_call_id",
    ),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
async def test_bad_chat_requests_are_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, body: dict[str, Any], param: str
) -> None:
    r = await client.post("/v1/chat/completions", json=body)
    assert_error(r, 400, param)
    assert fake.submitted == []  # nothing reached the engine


async def test_unknown_model_is_404(make_client: ClientFactory, fake: FakeEngine) -> None:
    # A single model answers any name unless [model_names] any_with_one_model is off.
    names = ModelNamesSection(any_with_one_model=False)
    client = make_client(fake, settings=Settings(model_names=names))
    error = assert_error(
        await client.post("/v1/chat/completions", json=chat(model="gpt-4o")), 404, "model"
    )
    assert error["code"] == "model_not_found"


async def test_max_tokens_past_the_context_is_clamped_not_refused(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    """Agents send max_tokens of 8,000-32,000 whatever the context (llama-server and
    Ollama clamp): the request runs and ends with `length` where the context does."""
    r = await client.post("/v1/chat/completions", json=chat(max_tokens=100000))
    assert r.status_code == 200, r.text
    assert fake.submitted[0].max_tokens == 100000


async def test_prompt_too_long_is_context_length_exceeded(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "x" * 600}])
    )
    assert assert_error(r, 400)["code"] == "context_length_exceeded"


async def test_unknown_fields_are_accepted(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(some_vendor_extra={"a": 1}))
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [[]]}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [1, 99999]}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 3}, "best_of"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 99}, "logprobs"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "echo": True, "logprobs": 1, "stream": True},
            "echo",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/embeddings", {"model": MODEL}, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": ""}, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": [1, -4]}, "input"),
        (
            "/v1/embeddings",
            {"model": MODEL, "input": "x", "encoding_format": "hex"},
            "encoding_format",
        ),
        ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 9}, "dimensions"),
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 5}, "content"),
    ],
)
async def test_bad_requests_on_other_endpoints(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post(path, json=body), 400, param)


async def test_invalid_json_and_wrong_method(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(r, 400)
    r = await client.post(
        "/v1/chat/completions",
        content=b"\xff\xfe\x00",
        headers={"content-type": "application/json"},
    )
    assert_error(r, 400)
    assert_error(await client.get("/v1/chat/completions"), 405)
    assert_error(await client.get("/v1/nothing-here"), 404)


async def test_metrics_expose_engine_gauges(client: httpx.AsyncClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    r = await client.get("/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families["kvserve_slots_total"].samples[0].value == 4
    assert families["kvserve_slots_in_use"].samples[0].labels == {"model": MODEL}
    assert families["kvserve_slots_in_use"].samples[0].value == 0
    assert "kvserve_sampled_tokens" in families


async def test_oversized_stop_and_grammar_are_refused(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/chat/completions", json=chat(stop="x" * 1001)), 400, "stop")
    assert_error(
        await client.post("/v1/chat/completions", json=chat(grammar="r" * (256 * 1024 + 1))),
        400,
        "grammar",
    )


async def test_completion_echo_with_logprobs_scores_the_prompt(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "Hi!", "echo": True, "logprobs": 1, "max_tokens": 2},
    )
    choice = r.json()["choices"][0]
    assert choice["text"] == "Hi!" + REPLY[:2]
    lp = choice["logprobs"]
    assert lp["tokens"] == ["H", "i", "!", "H", "e"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:3] == [-0.5, -0.5]
    assert lp["text_offset"] == [0, 1, 2, 3, 4]


async def test_completion_echo_logprobs_max_tokens_0_only_scores(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "Hey", "echo": True, "logprobs": 0, "max_tokens": 0},
    )
    choice = r.json()["choices"][0]
    assert choice["text"] == "Hey" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["H", "e", "y"]
    assert choice["logprobs"]["token_logprobs"] == [None, -0.5, -0.5]
    assert fake.submitted[0].max_tokens == 0 and fake.submitted[0].prompt_logprobs == 0
    assert r.json()["usage"]["completion_tokens"] == 0


async def test_streamed_echo_only_completion_is_sse(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "Hey",
            "echo": True,
            "max_tokens": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    first, last = json.loads(events[0]), json.loads(events[1])
    assert first["choices"][0]["text"] == "Hey" and first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] is None
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 3


async def test_stream_usage_reports_cached_tokens_from_the_finish(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.cached = 5
    r = await client.post(
        "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
    )
    usage_chunk = json.loads(sse_events(r.text)[-2])
    assert usage_chunk["usage"]["completion_tokens"] == len(REPLY) + 1
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
