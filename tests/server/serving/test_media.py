"""server/serving/media.py without the app: image parts read, limits, URL fetching from a
loopback server, the stored conversation's JSON, and the engine's "image N" named back."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chat.content import with_media_markers
from chat.tools import ChatInputError
from engine.client import Media
from server.config.media import MediaSection
from server.errors import BadRequest
from server.serving.media import (
    Image,
    ImagePart,
    chat_part,
    image_from_base64,
    image_from_url,
    read_images,
    restored_conversation,
    stored_conversation,
    tokenize_images,
)
from tests.fakes import FakeEngine

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(100, 250))


def data_url(data: bytes = PNG, kind: str = "image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


async def read(parts: list[ImagePart], **settings: Any) -> list[Image]:
    info = FakeEngine(vision=True).info
    messages = await read_images([user(*map(chat_part, parts))], info, MediaSection(**settings))
    return [p["image"] for p in messages[0]["content"]]


def test_data_url_parts() -> None:
    part = image_from_url(data_url(), "messages[0].content[1].image_url", detail="high")
    assert (part.param, part.media_type, part.url) == ("messages[0].content[1].image_url",
                                                       "image/png", "")  # fmt: skip
    assert base64.b64decode(part.data) == PNG
    assert image_from_url("https://example.com/a.png", "p").url == "https://example.com/a.png"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "data: URL or an http(s) URL"),
        ("ftp://example.com/a.png", "data: URL or an http(s) URL"),
        ("data:image/png,rawbytes", "base64 data URL"),
        ("data:text/plain;base64,aGVsbG8=", "'text/plain' is not an image type"),
        (42, "data: URL or an http(s) URL"),
    ],
)
def test_bad_urls_name_the_part(url: Any, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        image_from_url(url, "input[0].content[2].image_url")
    assert caught.value.param == "input[0].content[2].image_url"
    assert words in caught.value.message


def test_media_type_and_empty_data() -> None:
    assert image_from_base64("aGk=", "IMAGE/JPEG", "p").media_type == "image/jpeg"
    assert image_from_base64("aGk=", None, "p").media_type == ""
    for data, kind in (("", "image/png"), (None, "image/png"), ("aGk=", "application/pdf")):
        with pytest.raises(BadRequest) as caught:
            image_from_base64(data, kind, "messages[0].content[0].source")
        assert caught.value.param == "messages[0].content[0].source"


async def test_read_decodes_in_order_with_digests() -> None:
    wrapped = base64.encodebytes(JPEG).decode()  # line breaks, as some clients send it
    images = await read([image_from_base64(base64.b64encode(PNG).decode(), "image/png", "a"),
                         image_from_base64(wrapped, None, "b")])  # fmt: skip
    assert [i.param for i in images] == ["a", "b"]
    assert [i.media.data for i in images] == [PNG, JPEG]
    assert images[1].media.digest == hashlib.sha256(JPEG).hexdigest()


async def test_read_refusals() -> None:
    good = image_from_base64(base64.b64encode(PNG).decode(), None, "ok")
    with pytest.raises(BadRequest) as caught:
        await read([image_from_base64("not base64!", None, "messages[2].images[0]")])
    assert caught.value.param == "messages[2].images[0]"
    assert "not valid base64" in caught.value.message
    with pytest.raises(BadRequest) as caught:  # the first part past the count is named
        await read([good, good, image_from_base64("aGk=", None, "third")], max_images=2)
    assert caught.value.param == "third" and "max_images" in caught.value.message
    big = image_from_base64(base64.b64encode(bytes(2048)).decode(), None, "big")
    with pytest.raises(BadRequest) as caught:
        await read([good, big], max_image_bytes=1024)
    assert caught.value.param == "big" and "max_image_bytes" in caught.value.message
    huge = image_from_base64("A" * 100_000, None, "huge")  # refused before it is decoded
    with pytest.raises(BadRequest, match="larger than 1,024 bytes"):
        await read([huge], max_image_bytes=1024)


async def test_a_model_without_vision_refuses_the_first_image() -> None:
    messages = [user({"type": "text", "text": "hi"},
                     chat_part(image_from_base64("aGk=", None, "messages[0].content[1]")))]  # fmt: skip
    with pytest.raises(BadRequest) as caught:
        await read_images(messages, FakeEngine().info, MediaSection())
    assert caught.value.param == "messages[0].content[1]"
    assert "takes no images" in caught.value.message


async def test_urls_need_the_setting() -> None:
    with pytest.raises(BadRequest) as caught:
        await read([image_from_url("http://127.0.0.1:9/a.png", "messages[0].content[0].image_url")])
    assert caught.value.param == "messages[0].content[0].image_url"
    assert "allow_urls = true" in caught.value.message


def test_markers_and_order() -> None:
    a, b = object(), object()
    messages = [user({"type": "text", "text": "one "}, {"type": "image", "image": a, "param": "x"}),
                {"role": "assistant", "content": "ok"},
                user({"type": "image", "image": b, "param": "y"}, {"type": "text", "text": "two"})]
    out, media = with_media_markers(messages, "<M>")
    assert [m["content"] for m in out] == ["one <M>", "ok", "<M>two"]
    assert media == (a, b)
    with pytest.raises(ChatInputError) as caught:
        with_media_markers(messages, "")
    assert caught.value.param == "x"


def test_engine_decode_error_names_the_part() -> None:
    fake = FakeEngine(vision=True)
    images = [Image(Media(PNG, "d1"), "messages[0].content[0].image_url"),
              Image(Media(b"garbage", "d2"), "messages[3].content[1].image_url")]
    marker = fake.info.media_marker
    tokens = tokenize_images(fake, f"a{marker}b", images[:1], add_special=True)
    assert sum(t < 0 for t in tokens) == 4
    with pytest.raises(BadRequest) as caught:
        tokenize_images(fake, f"a{marker}b{marker}", images, add_special=True)
    assert caught.value.param == "messages[3].content[1].image_url"
    with pytest.raises(BadRequest) as caught:  # marker count differs: the first image
        tokenize_images(fake, "no markers", images[:1], add_special=True)
    assert caught.value.param == "messages[0].content[0].image_url"


def test_stored_conversation_round_trips_through_json() -> None:
    conversation = [user({"type": "text", "text": "look"},
                         chat_part(Image(Media(PNG, hashlib.sha256(PNG).hexdigest()), "p"))),
                    {"role": "assistant", "content": "a picture"}]  # fmt: skip
    back = restored_conversation(json.loads(json.dumps(stored_conversation(conversation))))
    assert back == conversation


# A loopback HTTP server: what each path answers.
class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/a.png":
            self._send(200, "image/png", PNG)
        elif self.path == "/page":
            self._send(200, "text/html", b"<html></html>")
        elif self.path == "/big":  # no Content-Length: the stream is cut at the limit
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"\x89PNG" + bytes(1020))
        elif self.path == "/declared-big":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
        elif self.path == "/slow":
            time.sleep(1.5)
            self._send(200, "image/png", PNG)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
        else:
            self._send(404, "text/plain", b"no")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def image_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_url_fetch(image_server: str) -> None:
    allow = {"allow_urls": True, "url_timeout_s": 5.0}
    (image,) = await read([image_from_url(f"{image_server}/a.png", "u")], **allow)
    assert image.media.data == PNG and image.param == "u"
    (moved,) = await read([image_from_url(f"{image_server}/moved", "u")], **allow)
    assert moved.media.data == PNG
    cases = {"/missing": "HTTP 404", "/page": "'text/html', not an image",
             "/big": "larger than 16,384 bytes", "/declared-big": "larger than 16,384 bytes"}
    for path, words in cases.items():
        with pytest.raises(BadRequest) as caught:
            await read([image_from_url(image_server + path, "input[1].content[0].image_url")],
                       max_image_bytes=16384, **allow)  # fmt: skip
        assert caught.value.param == "input[1].content[0].image_url", path
        assert words in caught.value.message, (path, caught.value.message)


async def test_url_fetch_time_limit(image_server: str) -> None:
    started = time.monotonic()
    with pytest.raises(BadRequest) as caught:
        await read([image_from_url(f"{image_server}/slow", "u")], allow_urls=True,
                   url_timeout_s=0.3)  # fmt: skip
    assert "url_timeout_s" in caught.value.message and caught.value.param == "u"
    assert time.monotonic() - started < 1.2
