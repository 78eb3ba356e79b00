"""Images on every API against the fake engine (issue 50 item 1): each API's image part
reaches the engine as the GenerateRequest's media, its positions in the prompt; every
refusal is a 400 in the API's own shape naming the part; capabilities say vision. Image
URLs ([media] allow_urls) are fetched from a loopback server on each API that takes them."""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.config.media import MediaSection
from server.config.tree import Settings
from tests.conftest import ClientFactory
from tests.fakes import FAKE_IMAGE_TOKENS, FakeEngine
from tests.helpers.threaded_server import serving_app
from tests.server.api.test_openai_api import MODEL
from tests.server.serving.test_image_header import png_header

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(120))
GIF = b"GIF89a" + bytes((2, 0, 2, 0)) + bytes(range(60, 156))  # 2 x 2 (its header's size)
B64, GIF64 = base64.b64encode(PNG).decode(), base64.b64encode(GIF).decode()
DATA_URL = "data:image/png;base64," + B64
MARKER = "<__media__>"


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(vision=True, n_ctx=8192)  # bytes are tokens: a tool prompt is long


def image_positions(fake: FakeEngine, index: int = -1) -> list[int]:
    return [t for t in fake.submitted[index].prompt_tokens if t < 0]


def prompt_text(fake: FakeEngine, index: int = -1) -> str:
    return bytes(t for t in fake.submitted[index].prompt_tokens if 0 <= t < 256).decode()


def chat(*content: dict[str, Any], role: str = "user") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 5, "messages": [{"role": role, "content": list(content)}]}


def image_url(url: str = DATA_URL, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


TEXT = {"type": "text", "text": "What is it?"}


async def test_chat_image_reaches_the_engine(
    client: httpx.AsyncClient, fake: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await client.post("/v1/chat/completions", json=chat(TEXT, image_url(detail="low")))
    assert r.status_code == 200, r.text
    (media,) = fake.submitted[0].media
    assert media.data == PNG and media.digest == hashlib.sha256(PNG).hexdigest()
    assert len(image_positions(fake)) == FAKE_IMAGE_TOKENS
    assert "What is it?" in prompt_text(fake) and MARKER not in prompt_text(fake)
    assert r.json()["usage"]["prompt_tokens"] == len(fake.submitted[0].prompt_tokens)
    assert "detail 'low' is a hint" in caplog.text


async def test_chat_images_keep_their_order(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    gif = image_url("data:image/gif;base64," + GIF64)
    body = chat(image_url(), TEXT, {"type": "image_url", "image_url": "data:image/gif;base64,"
                                    + GIF64})  # a bare string, as vLLM takes it  # fmt: skip
    body["messages"] += [{"role": "assistant", "content": "A picture."},
                         {"role": "user", "content": [gif]}]  # fmt: skip
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[0].media] == [PNG, GIF, GIF]
    assert len(image_positions(fake)) == 3 * FAKE_IMAGE_TOKENS


async def test_responses_input_image(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    first = {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Describe"},
        {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]}]}  # fmt: skip
    r = await client.post("/v1/responses", json=first)
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[0].media] == [PNG]
    # The stored conversation keeps the image: the next turn's prompt carries it again.
    second = {"model": MODEL, "previous_response_id": r.json()["id"], "input": "And now?"}
    r = await client.post("/v1/responses", json=second)
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[1].media] == [PNG]
    assert image_positions(fake, 1) == image_positions(fake, 0)


async def test_messages_image_blocks(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    tool_image = {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                              "data": GIF64}}  # fmt: skip
    body = {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": [block, {"type": "text", "text": "Take a screenshot"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "here"},
                                                  tool_image]}]}]}  # fmt: skip
    body["tools"] = [{"name": "shot", "input_schema": {"type": "object"}}]
    r = await client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[0].media] == [PNG, GIF]
    count = await client.post("/v1/messages/count_tokens", json=body)
    assert count.json()["input_tokens"] == len(fake.submitted[0].prompt_tokens)


async def test_ollama_images(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.post("/api/chat", json={"model": MODEL, "stream": False, "messages": [
        {"role": "user", "content": "What is this?", "images": [B64, GIF64]}]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[0].media] == [PNG, GIF]
    r = await client.post("/api/generate", json={"model": MODEL, "stream": False,
                                                 "prompt": "Describe", "images": [GIF64]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[1].media] == [GIF]
    assert prompt_text(fake, 1).index("Describe") > 0  # after the image, as Ollama puts it
    raw = await client.post("/api/generate", json={"model": MODEL, "stream": False, "raw": True,
                                                   "prompt": "x", "images": [B64]})  # fmt: skip
    assert raw.status_code == 400 and "images" in raw.json()["error"]


# Each API's request with one bad image, and the path its 400 names.
def _bad_requests(image: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(route, body, param) with `image` = {"b64": ..., "type": ...} in each API's form."""
    url = f"data:{image['type']};base64,{image['b64']}"
    return [
        ("/v1/chat/completions", chat(TEXT, image_url(url)), "messages[0].content[1].image_url"),
        ("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": url}]}]}, "input[0].content[0].image_url"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user",
            "content": [TEXT, {"type": "image", "source": {"type": "base64", "media_type":
                              image["type"], "data": image["b64"]}}]}]},
         "messages[0].content[1].source"),
        ("/api/chat", {"model": MODEL, "stream": False, "messages": [
            {"role": "user", "content": "hi", "images": [url]}]}, "messages[0].images[0]"),
    ]  # fmt: skip


def named(route: str, r: httpx.Response) -> str:
    """The error text of each API's shape (Anthropic's and Ollama's name the param in it)."""
    body = r.json()
    if route == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    if route.startswith("/api/"):
        return str(body["error"])
    return f"{body['error']['param']}: {body['error']['message']}"


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ({"b64": "%%%not-base64", "type": "image/png"}, "not valid base64"),
        ({"b64": B64, "type": "text/plain"}, "not an image type"),
        ({"b64": base64.b64encode(b"plain text").decode(), "type": "image/png"},
         "cannot be decoded"),  # the engine's "image 0", named back
        # A PNG header declaring 25,000 x 25,000 (~1.9 GB unpacked): refused unread.
        ({"b64": base64.b64encode(png_header(25_000, 25_000)).decode(), "type": "image/png"},
         "max_image_pixels"),
    ],
)
async def test_bad_images_name_the_part(
    client: httpx.AsyncClient, fake: FakeEngine, image: dict[str, Any], words: str
) -> None:
    for route, body, param in _bad_requests(image):
        if route == "/api/chat" and image["type"] == "text/plain":
            continue  # Ollama's images declare no type
        r = await client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        text = named(route, r)
        assert param in text and words in text, (route, text)
    assert fake.submitted == []


async def test_a_model_without_vision(make_client: ClientFactory) -> None:
    client = make_client(FakeEngine())
    for route, body, param in _bad_requests({"b64": B64, "type": "image/png"}):
        r = await client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        text = named(route, r)
        assert param in text and "takes no images" in text, (route, text)
    r = await client.post("/api/generate", json={"model": MODEL, "stream": False,
                                                 "prompt": "x", "images": [B64]})  # fmt: skip
    assert r.status_code == 400 and "images[0]" in r.json()["error"]


async def test_limits(make_client: ClientFactory, fake: FakeEngine) -> None:
    settings = Settings(media=MediaSection(max_images=2, max_image_bytes=1024))
    client = make_client(fake, settings=settings)
    r = await client.post("/v1/chat/completions", json=chat(image_url(), image_url(), image_url()))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[2].image_url"
    assert "max_images" in r.json()["error"]["message"]
    big = "data:image/png;base64," + base64.b64encode(PNG + bytes(2000)).decode()
    r = await client.post("/v1/chat/completions", json=chat(image_url(), image_url(big)))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[1].image_url"
    assert "max_image_bytes" in r.json()["error"]["message"]
    r = await client.post("/v1/chat/completions", json=chat(image_url("http://127.0.0.1:9/a.png")))
    assert r.status_code == 400 and "allow_urls" in r.json()["error"]["message"]
    assert fake.submitted == []


async def test_misplaced_images(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(image_url(), role="assistant"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].type"
    r = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": B64}}]}]})  # fmt: skip
    assert r.status_code == 400 and "messages[1].content[0].type" in named("/v1/messages", r)
    r = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file",
                                                                   "file_id": "f"}}]}]})  # fmt: skip
    assert r.status_code == 400 and "messages[0].content[0].source.type" in named(
        "/v1/messages", r)
    r = await client.post("/v1/responses", json={"model": MODEL, "input": [{"role": "user",
        "content": [{"type": "input_image", "file_id": "file-1"}]}]})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0].file_id"


async def test_capabilities(make_client: ClientFactory, fake: FakeEngine) -> None:
    client, text_only = make_client(fake), make_client(FakeEngine())
    for c, vision in ((client, True), (text_only, False)):
        (card,) = (await c.get("/v1/models")).json()["data"]
        assert card["meta"]["modalities"] == {"vision": vision, "audio": False}
        assert (await c.get("/props")).json()["modalities"]["vision"] is vision
        show = (await c.post("/api/show", json={"model": MODEL})).json()
        assert ("vision" in show["capabilities"]) is vision


async def test_template_and_tokenize_show_the_image(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    body = chat(TEXT, image_url())
    r = await client.post("/apply-template", json=body)
    assert r.status_code == 200 and "What is it?" + MARKER in r.json()["prompt"]
    r = await client.post("/tokenize", json={**body, "with_pieces": True})
    assert r.status_code == 200, r.text
    pieces = r.json()["tokens"]
    assert [p["piece"] for p in pieces if p["id"] < 0] == [""] * FAKE_IMAGE_TOKENS


# Image URLs through the routes ([media] allow_urls = true). The fetching itself (limits,
# redirects, time): tests/server/serving/test_media.py.
FETCHING = Settings(media=MediaSection(allow_urls=True, url_timeout_s=5.0))


@pytest.fixture
def image_host() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server whose /a.png is PNG (any other path: 404), and the paths it
    was asked for, in order."""
    fetched: list[str] = []

    async def picture(request: Request) -> Response:
        fetched.append(request.url.path)
        return Response(PNG, media_type="image/png")

    with serving_app(Starlette(routes=[Route("/a.png", picture)])) as url:
        yield url, fetched


def _url_requests(url: str) -> list[tuple[str, dict[str, Any], str]]:
    """(route, body, param): one image by URL in each API that takes URLs (Ollama's
    `images` are base64 only)."""
    return [
        ("/v1/chat/completions", chat(TEXT, image_url(url)), "messages[0].content[1].image_url"),
        ("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "Describe"},
            {"type": "input_image", "image_url": url}]}]}, "input[0].content[1].image_url"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user",
            "content": [TEXT, {"type": "image", "source": {"type": "url", "url": url}}]}]},
         "messages[0].content[1].source"),
    ]  # fmt: skip


async def test_image_urls_reach_the_engine(
    make_client: ClientFactory, fake: FakeEngine, image_host: tuple[str, list[str]]
) -> None:
    host, fetched = image_host
    client = make_client(fake, settings=FETCHING)
    for route, body, _ in _url_requests(f"{host}/a.png"):
        r = await client.post(route, json=body)
        assert r.status_code == 200, (route, r.text)
        (media,) = fake.submitted[-1].media
        assert media.data == PNG and media.digest == hashlib.sha256(PNG).hexdigest(), route
        assert len(image_positions(fake)) == FAKE_IMAGE_TOKENS, route
    assert fetched == ["/a.png"] * 3 and len(fake.submitted) == 3
    # A URL that gives no image: a 400 in the API's own shape naming the part.
    for route, body, param in _url_requests(f"{host}/missing.png"):
        r = await client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        text = named(route, r)
        assert param in text and "HTTP 404" in text, (route, text)
    assert len(fake.submitted) == 3


async def test_a_stored_conversation_keeps_the_fetched_image(
    make_client: ClientFactory, fake: FakeEngine, image_host: tuple[str, list[str]]
) -> None:
    host, fetched = image_host
    client = make_client(fake, settings=FETCHING)
    route, body, _ = _url_requests(f"{host}/a.png")[1]
    first = await client.post(route, json=body)
    assert first.status_code == 200, first.text
    # The next turn carries the bytes read on the first, at the same positions: the URL
    # is not fetched again (its answer may have changed; the cache keys the bytes).
    second = {"model": MODEL, "previous_response_id": first.json()["id"], "input": "And now?"}
    r = await client.post("/v1/responses", json=second)
    assert r.status_code == 200, r.text
    assert [m.data for m in fake.submitted[1].media] == [PNG]
    assert image_positions(fake, 1) == image_positions(fake, 0)
    assert fetched == ["/a.png"]
