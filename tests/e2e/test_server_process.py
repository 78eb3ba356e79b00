"""The real `kvserve` process on a free port, driven by the openai SDK and by curl."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from engine.llama import cpu_has_amx
from tests.kvserve_process import metrics, running

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--parallel", "2", "--api-key", KEY]
    with running(args, tmp_path_factory.mktemp("e2e")) as kvserve:
        yield kvserve.url


@pytest.fixture
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
        yield client


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def ask(client: openai.OpenAI, **extra: Any) -> Any:
    """MESSAGES, greedy, 24 tokens at most."""
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24, **extra  # type: ignore[arg-type]
    )


def test_sync_chat_completion(client: openai.OpenAI) -> None:
    completion = ask(client)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.prompt_tokens > 10
    again = ask(client)
    # The repeated prompt is reused from the slot, all but its last token (computed again
    # for its logits); both runs computed every row with the same (under 64 rows) kernels.
    assert again.choices[0].message.content == completion.choices[0].message.content
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # A longer one (128+ tokens) computes the warm tail the server reports again: a flash
    # attention tile, 64 rows, on a CPU where it pays for any chunk (AMX), else its last
    # token.
    card = client.models.retrieve(MODEL).model_extra or {}
    family = card["meta"]["family"]
    assert family["warm_start_rows"] == 64, family  # flash attention's tile, at most
    assert ("with AMX" if cpu_has_amx() else "without AMX") in family["warm_start_why"]
    # A repeat has one new row: padded to the tile only where every chunk is (AMX).
    tail = 64 if cpu_has_amx() else 1
    long = [{"role": "system", "content": "Answer briefly. " * 40}, *MESSAGES]
    first, second = (
        client.chat.completions.create(model=MODEL, messages=long, temperature=0, max_tokens=16)  # type: ignore[arg-type]
        for _ in range(2)
    )
    assert first.choices[0].message.content and second.choices[0].message.content
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens >= 2 * 64
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - tail


def test_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    whole = ask(client)
    stream = ask(client, stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def lane_writes(server: str) -> float:
    return metrics(server)["kvserve_lane_writes_total"]


def streamed(server: str, **extra: Any) -> tuple[list[dict[str, Any]], bytes]:
    """A streamed chat reply's chunks (data lines, [DONE] left out), and its raw bytes."""
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "stream": True, **extra}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server, headers=headers, timeout=60) as http:
        raw = http.post("/v1/chat/completions", json=body).content
    # SSE comments (a proxy ping, sent when a loaded machine stretches a stream) left out
    lines = [x for x in raw.decode().split("\n\n") if x and not x.startswith(":")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(x.removeprefix("data: ")) for x in lines[:-1]], raw


def test_a_plain_stream_s_tokens_go_out_through_its_lane(server: str) -> None:
    """After its first token, a plain one-choice stream's chunks are written by the
    engine thread (server/serving/wire.py): the same chunks, in order, as the loop's."""
    before = lane_writes(server)
    extra = {"max_tokens": 160, "ignore_eos": True, "stream_options": {"include_usage": True}}
    chunks, _ = streamed(server, **extra)
    written = lane_writes(server) - before
    assert written >= 100, written  # all but the first few of 160 tokens
    whole = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 160,
              "ignore_eos": True},
        headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
    ).json()  # fmt: skip
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[-2:-1]] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 160
    assert all(c["usage"] is None for c in chunks[:-1])


def test_a_session_s_streamed_turns_through_the_lane_continue_from_its_slot(server: str) -> None:
    """The lane and a session: the session's turn ends (and its KV stays) as without it."""
    before = lane_writes(server)
    first, _ = streamed(server, max_tokens=48, ignore_eos=True, session_id="lane-session",
                        stream_options={"include_usage": True})  # fmt: skip
    reply = "".join(c["choices"][0]["delta"].get("content", "") for c in first if c["choices"])
    turn = [*MESSAGES, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And of Spain?"}]  # fmt: skip
    second, _ = streamed(server, messages=turn, max_tokens=8, session_id="lane-session",
                         stream_options={"include_usage": True})  # fmt: skip
    assert lane_writes(server) - before >= 30
    usage = second[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= first[-1]["usage"]["prompt_tokens"]


def test_streams_whose_chunks_need_more_than_the_text_have_no_lane(server: str) -> None:
    before = lane_writes(server)
    chunks, _ = streamed(server, max_tokens=24, logprobs=True, top_logprobs=2)
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all(c["choices"][0]["logprobs"]["content"] for c in content)
    chunks, _ = streamed(server, max_tokens=24, n=2)
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    assert lane_writes(server) == before


async def test_async_client_concurrent_requests(server: str) -> None:
    import asyncio

    questions = ["Name a color.", "Name a fruit.", "Name a planet."]
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
        results = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": q}], temperature=0,
                    max_tokens=16,
                )
                for q in questions
            )
        )
    assert all(r.choices[0].message.content for r in results)


def test_completions_embeddings_models(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=8, temperature=0
    )
    assert completion.object == "text_completion" and completion.choices[0].text
    emb = client.embeddings.create(model=MODEL, input=["a cat", "a dog"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 576
    emb64 = client.embeddings.create(model=MODEL, input="a cat", encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(emb64.data[0].embedding), dtype="<f4")  # type: ignore[arg-type]
    np.testing.assert_allclose(raw, emb.data[0].embedding, rtol=1e-5, atol=1e-6)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_sdk_errors(client: openai.OpenAI, server: str) -> None:
    with pytest.raises(openai.NotFoundError):  # (inference answers any name on one model)
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)  # type: ignore[arg-type]
    assert err.value.body["param"] == "temperature"  # type: ignore[index]
    with (
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0) as bad_key,
        pytest.raises(openai.AuthenticationError),
    ):
        bad_key.models.list()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(server: str) -> None:
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "stream": True})
    out = subprocess.run(
        [
            "curl",
            "-sN",
            f"{server}/v1/chat/completions",
            "-H",
            f"Authorization: Bearer {KEY}",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["object"] == "chat.completion.chunk"
    health = subprocess.run(
        ["curl", "-s", f"{server}/health"], capture_output=True, text=True, timeout=30
    )
    assert json.loads(health.stdout) == {"status": "ok", "models": {MODEL: {"status": "ready"}}}


def slots_in_use(server: str) -> float:
    text = httpx.get(f"{server}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("kvserve_slots_in_use{"))
    return float(line.split()[1])


def test_dropped_stream_frees_its_slot(server: str) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 2000,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server, headers=headers, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(10):
                next(lines)
            assert slots_in_use(server) == 1
        deadline = time.monotonic() + 10
        while slots_in_use(server) != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slots_in_use(server) == 0
        after = http.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4})
        assert after.status_code == 200


def test_loglikelihood_scoring_as_evaluation_harnesses_do_it(client: openai.OpenAI) -> None:
    scored = client.completions.create(
        model=MODEL, prompt="The capital of France is Paris", max_tokens=0, echo=True, logprobs=1
    )
    choice = scored.choices[0]
    assert choice.text == "The capital of France is Paris"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    lps = choice.logprobs.token_logprobs
    assert lps[0] is None and all(v is not None and v <= 0 for v in lps[1:])
    assert "".join(choice.logprobs.tokens or []) == choice.text
    # A likely continuation scores higher than an unlikely one.
    unlikely = client.completions.create(
        model=MODEL, prompt="The capital of France is Banana", max_tokens=0, echo=True, logprobs=1
    )
    assert lps[-1] > unlikely.choices[0].logprobs.token_logprobs[-1]  # type: ignore[union-attr,index,operator]
