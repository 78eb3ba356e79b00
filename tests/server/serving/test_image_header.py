"""server/serving/image_header.py: each format's declared size from a tiny synthetic
header (nothing past the header is needed), and what reads as None; the pixel limit
read before anything decodes the bytes (server/serving/media.py)."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from server.config.media import MediaSection
from server.errors import BadRequest
from server.serving.image_header import image_size
from server.serving.media import chat_part, image_from_base64, read_images
from tests.fakes import FakeEngine


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + crc


def jpeg_header(width: int, height: int, sof: int = 0xC0) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + bytes(65)
    frame = struct.pack(">BHHB", 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + dqt + b"\xff\xff" + bytes([0xFF, sof]) + struct.pack(
        ">H", 2 + len(frame)) + frame  # fmt: skip


def gif_header(width: int, height: int, version: bytes = b"89a") -> bytes:
    return b"GIF" + version + struct.pack("<HHBBB", width, height, 0, 0, 0)


def bmp_header(width: int, height: int, dib: int = 40) -> bytes:
    file_header = b"BM" + struct.pack("<IHHI", 14 + dib, 0, 0, 14 + dib)
    if dib == 12:  # OS/2: 16-bit sides
        return file_header + struct.pack("<IHHHH", 12, width, height, 1, 24)
    return file_header + struct.pack("<IiiHH", dib, width, height, 1, 24) + bytes(dib - 16)


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png_header(25_000, 25_000), (25_000, 25_000)),
        (png_header(1, 7), (1, 7)),
        (jpeg_header(4032, 3024), (4032, 3024)),
        (jpeg_header(640, 480, sof=0xC2), (640, 480)),  # progressive
        (gif_header(320, 200), (320, 200)),
        (gif_header(65535, 65535, b"87a"), (65535, 65535)),
        (bmp_header(800, 600), (800, 600)),
        (bmp_header(800, -600, dib=124), (800, 600)),  # top-down, BITMAPV5HEADER
        (bmp_header(300, 200, dib=12), (300, 200)),
    ],
)
def test_each_format_s_declared_size(data: bytes, size: tuple[int, int]) -> None:
    assert image_size(data) == size


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"RIFF\x00\x00\x00\x00WEBPVP8 ",  # not a format the engine decodes: it refuses it
        png_header(10, 10)[:20],  # cut short
        b"\x89PNG\r\n\x1a\n" + bytes(range(120)),  # no IHDR first
        jpeg_header(10, 10)[:30],  # cut before the frame header
        b"\xff\xd8\xff\xda\x00\x08" + bytes(20),  # scan data before any frame header
        b"\xff\xd8\xff\xe0\x00\x01" + bytes(20),  # a segment length under 2
        b"\xff\xd8\x00\x00" + bytes(20),  # not a marker where one must be
        gif_header(10, 10)[:8],
        bmp_header(10, 10)[:20],
    ],
)
def test_what_reads_as_no_size(data: bytes) -> None:
    assert image_size(data) is None


async def test_the_pixel_limit_is_read_before_any_decode() -> None:
    def part(data: bytes, param: str) -> dict[str, object]:
        return chat_part(image_from_base64(base64.b64encode(data).decode(), None, param))

    info = FakeEngine(vision=True).info
    settings = MediaSection(max_image_pixels=1000 * 1000)
    at_limit = [part(png_header(1000, 1000), "ok"), part(bmp_header(1000, -1000), "ok2")]
    messages = [{"role": "user", "content": at_limit}]
    assert len((await read_images(messages, info, settings))[0]["content"]) == 2
    # One pixel over, in each format: a 400 naming the part, the sizes and the setting.
    for data in (png_header(1001, 1000), jpeg_header(1000, 1001), gif_header(2000, 501),
                 bmp_header(1001, 1000, dib=12)):  # fmt: skip
        messages = [{"role": "user", "content": [at_limit[0], part(data, "big")]}]
        with pytest.raises(BadRequest) as caught:
            await read_images(messages, info, settings)
        assert caught.value.param == "big"
        assert "max_image_pixels" in caught.value.message and "1,000,000" in caught.value.message
