"""A request's images: the parts each API sends -> the `Media` the engine takes.

Each API reads its own image part's shape (server/api/*/input.py) into an `ImagePart`
with `image_from_url` or `image_from_base64`, and puts it in the chat message's content
as a part of the common form (`chat_part`): `{"type": "image", "image": ..., "param": ...}`.
`read_images` then reads every part once, before the plan (server/serving/prepare.py
`with_images` calls it only where a message has parts, so a text-only request runs no
code here): the model must have a projector, the count, the bytes and the pixels
(read from each file's header, server/serving/image_header.py) stay within `[media]`,
base64 is decoded in a worker thread and http(s) URLs are fetched (only where `[media]
allow_urls` says so, server/serving/media_fetch.py). The chat plan (chat/plan.py) puts the model's
`media_marker` where each image was and collects the images in order; the prompt is
tokenized by `tokenize_images`, which names the part of an image the engine could not
decode (the engine says "image N").

Every refusal is a 400 in the API's own shape naming the part, e.g.
`messages[1].content[0].image_url`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.client import EngineLike, InvalidRequestError, Media, ModelInfo
from server.config.media import MediaSection
from server.errors import BadRequest
from server.serving.image_header import image_size
from server.serving.media_fetch import fetch_image

log = logging.getLogger("kvserve.server")

# The image types a part may declare. llama.cpp's projector reads the file with
# stb_image (PNG, JPEG, GIF, BMP, ...); WebP is Anthropic's fourth type, accepted here
# and refused by the engine's decoder with the part named, if the build cannot read it.
MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp", "image/bmp")


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image as the request sent it, not read yet: base64 text or an http(s) URL."""

    param: str  # where the request has it, e.g. messages[1].content[0].image_url
    data: str = field(default="", repr=False)  # base64
    url: str = ""
    media_type: str = ""  # as declared; "" where the API declares none (Ollama, URLs)


@dataclass(frozen=True, slots=True)
class Image:
    """An image read: its bytes as the engine takes them, and where the request had it."""

    media: Media
    param: str


def chat_part(image: ImagePart | Image) -> dict[str, Any]:
    """The image as a part of a chat message's content (chat/plan.py reads it)."""
    return {"type": "image", "image": image, "param": image.param}


def image_from_url(url: Any, param: str, detail: Any = None) -> ImagePart:
    """OpenAI's `image_url` (Chat and Responses): a data URL or an http(s) URL. `detail`
    (low/high/auto) is a hint: the projector sees every image at its own resolution."""
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{param}' must be a data: URL or an http(s) URL", param=param)
    if detail is not None:
        log.info("%s: detail %r is a hint; the projector reads the image at its own size",
                 param, detail)  # fmt: skip
    if url.startswith("data:"):
        head, comma, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if not comma or encoding.lower() != "base64":
            raise BadRequest(f"'{param}' must be a base64 data URL "
                             "(data:image/png;base64,...)", param=param)  # fmt: skip
        return image_from_base64(data, media_type, param)
    if url.startswith(("http://", "https://")):
        return ImagePart(param, url=url)
    raise BadRequest(f"'{param}' must be a data: URL or an http(s) URL, not "
                     f"'{url[:32]}'", param=param)  # fmt: skip


def image_from_base64(data: Any, media_type: Any, param: str) -> ImagePart:
    """Base64 image data with its declared type (None: the API declares none)."""
    if not isinstance(data, str) or not data:
        raise BadRequest(f"'{param}' must be non-empty base64 image data", param=param)
    if media_type is not None:
        if not isinstance(media_type, str) or media_type.lower() not in MEDIA_TYPES:
            raise BadRequest(f"'{param}': media type {media_type!r} is not an image type "
                             f"this server reads; one of {', '.join(MEDIA_TYPES)}",
                             param=param)  # fmt: skip
        media_type = media_type.lower()
    return ImagePart(param, data=data, media_type=media_type or "")


def image_parts(messages: Sequence[dict[str, Any]]) -> list[ImagePart | Image]:
    """The images of a conversation, in order."""
    return [part["image"] for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image"]  # fmt: skip


async def read_images(
    messages: list[dict[str, Any]], info: ModelInfo, settings: MediaSection
) -> list[dict[str, Any]]:
    """The messages with every image part read (`Image`s in place of `ImagePart`s);
    the same list when there are none to read. Images read before (a stored
    conversation's) are kept as they are and not counted again."""
    unread = [p for p in image_parts(messages) if isinstance(p, ImagePart)]
    if not unread:
        return messages
    if not info.vision:
        raise BadRequest(f"the model '{info.model_id}' takes no images (no vision projector "
                         "is loaded: a model entry's `mmproj`)", param=unread[0].param)  # fmt: skip
    if len(unread) > settings.max_images:
        first_over = unread[settings.max_images].param
        raise BadRequest(f"{len(unread)} images in one request; at most {settings.max_images} "
                         "([media] max_images)", param=first_over)  # fmt: skip
    read = [await _read(p, settings) for p in unread]  # in order: the first bad one is named
    images = {id(p): image for p, image in zip(unread, read, strict=True)}
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(id(p.get("image")) in images for p in content):
            parts = [chat_part(images[id(p["image"])]) if id(p.get("image")) in images else p
                     for p in content]  # fmt: skip
            message = {**message, "content": parts}
        out.append(message)
    return out


async def _read(part: ImagePart, settings: MediaSection) -> Image:
    if part.url:
        if not settings.allow_urls:
            raise BadRequest(f"'{part.param}': this server does not fetch image URLs; send "
                             "the image as base64 (a data: URL), or allow fetching with "
                             "[media] allow_urls = true", param=part.param)  # fmt: skip
        data = await fetch_image(part.url, part.param, settings.max_image_bytes,
                                 settings.url_timeout_s)  # fmt: skip
        return await asyncio.to_thread(_image, data, part.param, settings)
    # base64 is 4 characters for 3 bytes: a text this long decodes past the limit.
    if len(part.data) > (settings.max_image_bytes + 2) // 3 * 4 + 4096:  # (+ line breaks)
        raise _too_large(part.param, settings.max_image_bytes)
    data = await asyncio.to_thread(_decode, part.data, part.param)
    if len(data) > settings.max_image_bytes:
        raise _too_large(part.param, settings.max_image_bytes)
    return await asyncio.to_thread(_image, data, part.param, settings)


def _too_large(param: str, limit: int) -> BadRequest:
    return BadRequest(f"'{param}': the image is larger than {limit:,} bytes "
                      "([media] max_image_bytes)", param=param)  # fmt: skip


def _decode(text: str, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:  # base64 wrapped in lines, as some clients send it
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"'{param}' is not valid base64: {exc}", param=param) from None


def _image(data: bytes, param: str, settings: MediaSection) -> Image:
    if not data:
        raise BadRequest(f"'{param}' holds no image data", param=param)
    # The size its header declares, before anything decodes it (server/serving/image_header.py);
    # bytes of no format read here are refused by the engine's decoder, the part named.
    size = image_size(data)
    if size is not None and size[0] * size[1] > settings.max_image_pixels:
        raise BadRequest(f"'{param}': the image is {size[0]:,} x {size[1]:,} pixels; at most "
                         f"{settings.max_image_pixels:,} pixels ([media] max_image_pixels)",
                         param=param)  # fmt: skip
    return Image(Media(data, hashlib.sha256(data).hexdigest()), param)


def tokenize_images(
    engine: EngineLike, text: str, images: Sequence[Any], *, add_special: bool
) -> list[int]:
    """The prompt's tokens with its images' positions (blocking: call it off the event
    loop). An image the engine cannot decode is a 400 naming its part."""
    read = [i for i in images if isinstance(i, Image)]
    if len(read) != len(images):  # a caller that skipped read_images: a bug, not the client's
        raise RuntimeError("tokenize_images: the images were not read (read_images)")
    try:
        return engine.tokenize_media(text, [i.media for i in read], add_special=add_special)
    except InvalidRequestError as exc:
        raise BadRequest(exc.message, param=_part_param(exc.param, read)) from None


def _part_param(param: str | None, images: Sequence[Image]) -> str | None:
    """The engine's "image N" as the request's path to that image."""
    index = (param or "").removeprefix("image ")
    if index.isdigit() and int(index) < len(images):
        return images[int(index)].param
    return images[0].param if images and param == "image" else param


def media_of(images: Sequence[Any]) -> tuple[Media, ...]:
    """What a GenerateRequest carries for a plan's images."""
    return tuple(i.media for i in images if isinstance(i, Image))


def stored_conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as JSON (the shared response store): images as base64."""
    return [_map_images(m, _image_json) for m in messages]


def restored_conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`stored_conversation`'s inverse."""
    return [_map_images(m, _image_from_json) for m in messages]


def _map_images(message: dict[str, Any], convert: Any) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list) or not any(p.get("type") == "image" for p in content):
        return message
    return {**message, "content": [convert(p) if p.get("type") == "image" else p
                                   for p in content]}  # fmt: skip


def _image_json(part: dict[str, Any]) -> dict[str, Any]:
    image = part["image"]
    if isinstance(image, Image):
        data = base64.b64encode(image.media.data).decode()
        return {"type": "image", "param": image.param, "data": data, "digest": image.media.digest}
    return {"type": "image", "param": image.param, "data": image.data, "url": image.url,
            "media_type": image.media_type, "unread": True}  # fmt: skip


def _image_from_json(part: dict[str, Any]) -> dict[str, Any]:
    if "image" in part:  # not stored as JSON (the process's own store)
        return part
    if part.get("unread"):
        return chat_part(ImagePart(part["param"], part["data"], part["url"], part["media_type"]))
    media = Media(base64.b64decode(part["data"]), part["digest"])
    return chat_part(Image(media, part["param"]))
