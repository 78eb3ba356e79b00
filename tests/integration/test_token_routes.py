"""llama-server's token-level surface on the real default model (SmolLM2's vocabulary
and ChatML template): a chat's tokens are what chat completions prefills, pieces and
/detokenize show its special tokens, /props has its special ids, and a reply's
`tokens` and `timings` agree with its text and usage."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from server.app import create_app
from server.config.tree import Settings
from tests.integration.test_engine import start

pytestmark = pytest.mark.model
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    engine = await start(n_ctx=1024, n_seq_max=2, embeddings=False, exact_reuse=False)
    app = create_app(Settings(), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c
    engine.close()


async def test_a_chats_tokens_and_pieces(client: httpx.AsyncClient) -> None:
    prompt = (await client.post("/apply-template", json={"messages": MESSAGES})).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>assistant\n")
    body = {"messages": MESSAGES, "with_pieces": True}
    pieces = (await client.post("/tokenize", json=body)).json()["tokens"]
    assert pieces[0]["piece"] == "<|im_start|>"  # a special token, as its text
    assert "".join(p["piece"] for p in pieces) == prompt
    ids = [p["id"] for p in pieces]
    assert (await client.post("/tokenize", json={"content": prompt})).json()["tokens"] == ids
    chat = {"model": "smol", "messages": MESSAGES, "max_tokens": 1}
    usage = (await client.post("/v1/chat/completions", json=chat)).json()["usage"]
    assert usage["prompt_tokens"] == len(ids)
    shown = (await client.post("/detokenize", json={"tokens": ids})).json()["content"]
    assert shown == prompt
    plain = await client.post("/detokenize", json={"tokens": ids, "unparse_special": False})
    assert plain.json()["content"] == "system\nBe brief.\nuser\nHi!\nassistant\n"


async def test_special_ids(client: httpx.AsyncClient) -> None:
    special = (await client.get("/props")).json()["special_tokens"]
    assert (special["bos"], special["eos"], special["nl"]) == (1, 2, 198)
    assert special["fim_pre"] is None
    meta = (await client.get("/v1/models")).json()["data"][0]["meta"]
    assert meta["special_tokens"] == special
    eos = (await client.post("/detokenize", json={"tokens": [special["eos"]]})).json()
    assert eos["content"] == "<|im_end|>"


async def test_reply_tokens_and_timings(client: httpx.AsyncClient) -> None:
    chat = {"model": "smol", "messages": MESSAGES, "max_tokens": 12, "temperature": 0,
            "return_tokens": True, "timings_per_token": True}  # fmt: skip
    reply = (await client.post("/v1/chat/completions", json=chat)).json()
    choice, usage, timings = reply["choices"][0], reply["usage"], reply["timings"]
    text = (await client.post("/detokenize", json={"tokens": choice["tokens"],
                                                   "unparse_special": False})).json()["content"]  # fmt: skip
    assert text.strip() == choice["message"]["content"].strip()
    assert timings["predicted_n"] == usage["completion_tokens"] == len(choice["tokens"])
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0
