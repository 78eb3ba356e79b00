"""A sliding-window state blob laid out as a cold sequence's cells, for exact reuse.

llama.cpp writes a sequence's sliding-window layers only for the positions the next token
attends to (the last n_swa: engine/thread/slots.py window_floor), and restores them into the
first free cells of the stream, so a restored window of positions N-n_swa..N-1 sits in
cells 0..n_swa-1 where a cold sequence holds them in cells N-n_swa..N-1. Attention sums
over cells in cell order (SIMD lanes, flash attention's tiles), so continuing it gave other
logits: Gemma 3 270M, 700 tokens restored then 96 more, max |dlogit| 0.86 with flash
attention and 0.96 without. `at_cold_cells` puts N-n_swa zero cells (positions 0..N-n_swa-1,
masked for every later token: their values are never read into a sum) before the window
in the blob, so the restore fills cells 0..N-1 as the cold prefill did: measured
bit-identical to the cold logits on Gemma 3 270M (flash attention on and off) and on the
random-weight gemma2, gemma3, cohere2, gpt-oss and lfm2 models (/tmp measurement, issue 49).

The blob (llama-context.cpp state_seq_write_data, llama-kv-cache.cpp state_write): a
magic and the sequence id, then the memory's sections: an iswa cache writes its full
attention cache and then its window cache (a hybrid's recurrent part follows, kept as it
is). Each cache section: n_stream, then per stream a cell count and, if any, each cell's
(position, n_seq_id, seq ids), then v_trans, n_layer, each layer's K (type, row size,
rows), each layer's V (type, row size, rows; or transposed: type, element size, n_embd,
then per embedding row the cells' elements). Anything else (cells with extra data, layers
without V, cells out of order) reads as unknown: None, and the restore is refused.
Pure bytes; engine thread only.
"""

from __future__ import annotations

import struct

HEAD = 8  # io magic (u32) and sequence id (i32)


class Unknown(ValueError):
    """The blob is not laid out as this module reads it."""


def at_cold_cells(state: bytes) -> bytes | None:
    """`state` with its window cache's cells preceded by zero cells for the positions
    below its window (None: a layout this does not know; never a half-written blob)."""
    data = memoryview(state)
    out = bytearray(data[:HEAD])
    try:
        end = _section(data, HEAD, out, pad=False)  # full attention: as it is
        end = _section(data, end, out, pad=True)
    except (Unknown, struct.error):
        return None
    out += data[end:]  # a hybrid's recurrent state
    return bytes(out)


def _read(fmt: str, data: memoryview, offset: int) -> tuple[int, ...]:
    return struct.unpack_from(fmt, data, offset)


def _section(data: memoryview, at: int, out: bytearray, *, pad: bool) -> int:
    """Copy one cache's section from `at` into `out` (with `pad`: zero cells for the
    positions under its window, in front); returns where the section ends."""
    (n_stream,) = _read("<I", data, at)
    if not 0 < n_stream <= 4096:
        raise Unknown("stream count")
    out += data[at : at + 4]
    at += 4
    for _ in range(n_stream):
        (count,) = _read("<I", data, at)
        at += 4
        if count == 0:
            out += struct.pack("<I", 0)
            continue
        cells, first, at = _cells(data, at, count)
        extra = first if pad else 0
        if not pad and first != 0:
            raise Unknown("full attention cells start past position 0")
        out += struct.pack("<I", count + extra)
        seq_ids = bytes(cells[8:12])  # the first cell's one sequence id
        for pos in range(extra):
            out += struct.pack("<iI", pos, 1) + seq_ids
        out += cells
        at = _rows(data, at, out, count, extra)
    return at


def read_cells(data: memoryview, at: int, count: int) -> tuple[int, int]:
    """A stream's cell list read (each of one sequence, positions consecutive): the first
    position, and where the list ends."""
    _, first, end = _cells(data, at, count)
    return first, end


def _cells(data: memoryview, at: int, count: int) -> tuple[memoryview, int, int]:
    """A stream's cell list (each of one sequence, positions consecutive), the first
    position, and where the list ends."""
    first = _read("<i", data, at)[0]
    for index in range(count):
        pos, n_seq = _read("<iI", data, at + 12 * index)
        if n_seq != 1 or pos != first + index:
            raise Unknown("cells")
    return data[at : at + 12 * count], first, at + 12 * count


def _rows(data: memoryview, at: int, out: bytearray, count: int, extra: int) -> int:
    """Copy K and V of `count` cells, `extra` zero cells before each layer's (or each
    transposed V row's) data."""
    v_trans, n_layer = _read("<II", data, at)
    if v_trans > 1 or n_layer > 4096:
        raise Unknown("layers")
    out += data[at : at + 8]
    at += 8
    for _ in range(2 if not v_trans else 1):  # K, then V laid out as K
        for _ in range(n_layer):
            _, row = _read("<iQ", data, at)
            out += data[at : at + 12]
            out += bytes(extra * row)
            at += 12
            out += _take(data, at, count * row)
            at += count * row
    if v_trans:
        for _ in range(n_layer):
            _, size, n_embd = _read("<iII", data, at)
            out += data[at : at + 12]
            at += 12
            for _ in range(n_embd):
                out += bytes(extra * size)
                out += _take(data, at, count * size)
                at += count * size
    return at


def _take(data: memoryview, at: int, size: int) -> memoryview:
    if at + size > len(data):
        raise Unknown("short")
    return data[at : at + size]
