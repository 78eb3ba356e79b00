"""An image's width and height, read from its file header without decoding it.

A request's image is bounded in bytes ([media] max_image_bytes) and in pixels ([media]
max_image_pixels): a few-MB PNG of a blank 25,000 x 25,000 picture compresses to almost
nothing and unpacks to ~1.9 GB in llama.cpp's decoder (stb_image, 3 bytes a pixel). So
the size is read here, from the bytes the header declares, before anything decodes them
(server/serving/media.py).

The formats are the four the engine's decoder takes (engine/llama/vision.py refuses any
other leading bytes): PNG (IHDR), JPEG (the SOFn segment), GIF (the logical screen,
which stb_image composes every frame on) and BMP (the DIB header). Anything else, or a
header cut short, reads as None: the engine refuses those bytes with the part named, and
none of them reaches stb_image unread.
"""

from __future__ import annotations

import struct

_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG markers that carry a frame's size: SOF0..SOF15 but DHT (C4), JPG (C8), DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone (no length field): TEM, RST0..7, SOI, EOI.
_JPEG_BARE = frozenset({0x01, *range(0xD0, 0xDA)})


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) the header declares; None where it is not one of the four
    formats or is cut short."""
    if data.startswith(_PNG):
        return _png(data)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
        width, height = struct.unpack_from("<HH", data, 6)
        return width, height
    if data.startswith(b"BM"):
        return _bmp(data)
    return None


def _png(data: bytes) -> tuple[int, int] | None:
    # The first chunk must be IHDR (length 13): width, height as big-endian uint32.
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return width, height


def _jpeg(data: bytes) -> tuple[int, int] | None:
    # Walk the segments from SOI: each is FF, a marker, then (most) a big-endian length
    # that counts itself; the frame header (SOFn) holds precision, height, width. The
    # entropy-coded data only starts after SOS, which every decodable file has after SOFn.
    at, n = 2, len(data)
    while at + 4 <= n:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker in _JPEG_BARE:
            at += 2
            continue
        if marker == 0xDA:  # SOS before any frame header: no size to read
            return None
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _JPEG_SOF:
            if at + 9 > n:
                return None
            height, width = struct.unpack_from(">HH", data, at + 5)
            return width, height
        if length < 2:
            return None
        at += 2 + length
    return None


def _bmp(data: bytes) -> tuple[int, int] | None:
    # A 14-byte file header, then the DIB header, which starts with its own size: 12 for
    # OS/2's BITMAPCOREHEADER (16-bit sides), 40+ for the others (32-bit signed sides;
    # a negative height is a top-down picture).
    if len(data) < 26:
        return None
    (dib,) = struct.unpack_from("<I", data, 14)
    width, height = struct.unpack_from("<HH" if dib == 12 else "<ii", data, 18)
    return abs(width), abs(height)
