"""An image on every API, end to end: the real kvserve process with SmolLM2 and the
test-made projector (tests/helpers/vision_projector.py), driven over HTTP in each API's
own shape. Random projector weights: the answers mean nothing, the plumbing is what is
checked (the image's positions in the prompt, an answer, its reuse on turn 2)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.vision_projector import IMAGE_TOKENS, png, projector_path
from tests.kvserve_process import running

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
IMAGE = base64.b64encode(png(64, 64, seed=1)).decode()
DATA_URL = "data:image/png;base64," + IMAGE


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {"KVSERVE_MODEL_MMPROJ": str(projector_path())}
    with running(["--parallel", "2"], tmp_path_factory.mktemp("kvserve"), env=env) as s:
        yield s.url


def post(server: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_model_says_it_takes_images(server: str) -> None:
    (card,) = httpx.get(f"{server}/v1/models", timeout=10).json()["data"]
    assert card["meta"]["modalities"] == {"vision": True, "audio": False}
    show = httpx.post(f"{server}/api/show", json={"model": MODEL}, timeout=10).json()
    assert "vision" in show["capabilities"]


def test_openai_chat_reuses_the_image_on_turn_2(server: str) -> None:
    user = {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                        {"type": "image_url", "image_url": {"url": DATA_URL}}]}
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [user]}
    text_only = {**body, "messages": [{"role": "user", "content": "What is this?"}]}
    plain = post(server, "/v1/chat/completions", text_only)  # first: it shares turn 1's head
    first = post(server, "/v1/chat/completions", body)
    # The marker's text is gone and the image's positions are in its place.
    assert first["usage"]["prompt_tokens"] >= plain["usage"]["prompt_tokens"] + IMAGE_TOKENS - 1
    assert first["choices"][0]["finish_reason"] in ("stop", "length")
    answer = first["choices"][0]["message"]["content"] or ""
    turn2 = {**body, "messages": [user, {"role": "assistant", "content": answer},
                                  {"role": "user", "content": "And the colours?"}]}  # fmt: skip
    second = post(server, "/v1/chat/completions", turn2)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - 1  # the image was not computed again


def test_responses(server: str) -> None:
    body = {"model": MODEL, "max_output_tokens": 4, "temperature": 0, "store": False,
            "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Describe it."},
                {"type": "input_image", "image_url": DATA_URL}]}]}  # fmt: skip
    reply = post(server, "/v1/responses", body)
    assert reply["status"] in ("completed", "incomplete")
    assert reply["usage"]["input_tokens"] > IMAGE_TOKENS


def test_anthropic_messages(server: str) -> None:
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": IMAGE}},
            {"type": "text", "text": "What is in the picture?"}]}]}  # fmt: skip
    reply = post(server, "/v1/messages", body)
    assert reply["stop_reason"] in ("end_turn", "max_tokens")
    usage = reply["usage"]
    counted = post(server, "/v1/messages/count_tokens", {k: body[k] for k in ("model", "messages")})
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted["input_tokens"]
    assert counted["input_tokens"] > IMAGE_TOKENS


def test_ollama_chat_and_generate(server: str) -> None:
    options = {"num_predict": 4, "temperature": 0}
    chat = post(server, "/api/chat", {"model": MODEL, "stream": False, "options": options,
                                      "messages": [{"role": "user", "content": "What is this?",
                                                    "images": [IMAGE]}]})  # fmt: skip
    assert chat["done"] and chat["message"]["role"] == "assistant"
    generate = post(server, "/api/generate", {"model": MODEL, "stream": False, "options": options,
                                              "prompt": "Describe it.", "images": [IMAGE]})  # fmt: skip
    assert generate["done"]


def test_an_undecodable_image_is_a_400_naming_the_part(server: str) -> None:
    bad = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
    r = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": bad}}]}]})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0].image_url"
