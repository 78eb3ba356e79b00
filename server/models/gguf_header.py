"""What a GGUF file says about its model without loading it: the metadata and the
parameter count, read from the file's header (for `/api/show` on a model not loaded yet).

The layout (GGUF versions 2 and 3, little-endian): magic `GGUF`, version (u32), tensor
count (u64), metadata count (u64); each metadata entry a string key, a u32 type and its
value; then one entry per tensor: its name, its dimensions, its type and offset. Only
the header is read, never the tensor data; arrays (the tokenizer's run to megabytes)
are stepped over. Values are text, as the loaded model's metadata has them (numbers and
booleans too; /api/show turns them back into numbers).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"GGUF"
# type id -> (struct format, size): the fixed-size scalar types
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
            5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
            12: ("<d", 8)}  # fmt: skip
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 26  # 64 MiB: more is a damaged file, not a chat template
_MAX_DIMS = 8


class GgufError(Exception):
    """The file is not a GGUF this reader understands; the text says why."""


@dataclass(frozen=True, slots=True)
class GgufHeader:
    metadata: dict[str, str]  # key -> value as text; arrays left out
    n_params: int  # the elements of every tensor


def read_header(path: str) -> GgufHeader:
    """The metadata and parameter count of the GGUF at `path` (blocking file reads)."""
    try:
        with open(path, "rb") as fh:
            return _read(fh)
    except (OSError, struct.error, UnicodeDecodeError) as exc:
        raise GgufError(f"{path}: {exc}") from None


def _read(fh: BinaryIO) -> GgufHeader:
    if fh.read(4) != MAGIC:
        raise GgufError("not a GGUF file")
    (version,) = _unpack(fh, "<I", 4)
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not read here (2 and 3 are)")
    n_tensors, n_kv = _unpack(fh, "<QQ", 16)
    metadata: dict[str, str] = {}
    for _ in range(n_kv):
        key = _string(fh)
        (kind,) = _unpack(fh, "<I", 4)
        value = _value(fh, kind)
        if value is not None:
            metadata[key] = value
    n_params = 0
    for _ in range(n_tensors):
        _string(fh)  # the tensor's name
        (n_dims,) = _unpack(fh, "<I", 4)
        if n_dims > _MAX_DIMS:
            raise GgufError(f"a tensor with {n_dims} dimensions")
        dims = _unpack(fh, f"<{n_dims}Q", 8 * n_dims)
        _unpack(fh, "<IQ", 12)  # its type and offset
        n_params += math.prod(dims)
    return GgufHeader(metadata, n_params)


def _unpack(fh: BinaryIO, fmt: str, size: int) -> tuple[int, ...]:
    data = fh.read(size)
    if len(data) != size:
        raise GgufError("the header ends early")
    return struct.unpack(fmt, data)  # type: ignore[no-any-return]


def _string(fh: BinaryIO) -> str:
    (length,) = _unpack(fh, "<Q", 8)
    if length > _MAX_STRING:
        raise GgufError(f"a string of {length} bytes")
    data = fh.read(length)
    if len(data) != length:
        raise GgufError("the header ends early")
    return data.decode("utf-8", "replace")


def _value(fh: BinaryIO, kind: int) -> str | None:
    """One value as text; None for an array (stepped over)."""
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        _skip_array(fh)
        return None
    if kind not in _SCALARS:
        raise GgufError(f"unknown metadata type {kind}")
    fmt, size = _SCALARS[kind]
    (value,) = struct.unpack(fmt, fh.read(size))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _skip_array(fh: BinaryIO) -> None:
    kind, count = _unpack(fh, "<IQ", 12)
    if kind == _STRING:  # each string carries its own length: step over them one by one
        for _ in range(count):
            (length,) = _unpack(fh, "<Q", 8)
            fh.seek(length, 1)
    elif kind in _SCALARS:
        fh.seek(_SCALARS[kind][1] * count, 1)
    elif kind == _ARRAY:  # GGUF has no arrays of arrays in practice; refuse, do not guess
        raise GgufError("an array of arrays")
    else:
        raise GgufError(f"unknown array element type {kind}")
