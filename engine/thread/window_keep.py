"""A sliding window's cells kept past a saved state's own window, so that the state can be
cut back to where a later turn's exact recompute starts (exact reuse, issue 49).

llama.cpp writes a sequence's window layers only for the positions its next token attends
to (llama-kv-cache.cpp state_write skips SWA-masked cells), so a state of N tokens holds
window cells N-n_swa..N-1 and a cut to K needs cells from K-n_swa+1: it cannot be cut
back at all (slots.window_floor). The slot itself keeps every cell (swa_full), and the
states saved on the way through a prompt hold the earlier ones: the tail checkpoint at
the prompt's reuse limit L holds L-n_swa..L-1. Where the window is at least as long as the
recomputed tail (N-L), the two together cover L-n_swa..N-1, and `merge` writes the end's
state with those cells in its window section: a blob that can be cut anywhere from L-1 up,
as an attention model's can. The cells it adds are bytes the slot holds for positions it
has not cut since (the ledger's `valid_upto`), copied from the blob that held them: the
cold prefill's own bits. How far back a merge reaches is bounded (`reach`, SchedulerConfig
.window_recut), so a blob grows by that many window cells, not by a conversation's length.

The layout read here is window_blob's (the module docstring there). Pure bytes; engine
thread, and the lookup threads (`window_start`, read only).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import cast

from engine.thread.window_blob import HEAD, Unknown, read_cells

# (the 12-byte header of a layer's K or V, its unit: bytes a cell, its slices of units)
_Part = tuple[bytes, int, tuple[bytes | memoryview, ...]]


@dataclass(frozen=True, slots=True)
class Window:
    """The window cache's section of a state blob: one stream's consecutive cells."""

    first: int  # the position of its first cell
    count: int
    stream: int  # which of the section's n_stream holds them
    n_stream: int
    seq_id: bytes  # the cells' sequence id as written
    layers: bytes  # v_trans and n_layer as written
    parts: tuple[_Part, ...]  # each layer's K, then each layer's V (or each V row)

    def fits(self, other: Window) -> bool:
        """Same layout of cells' data (the same model and cache types)."""
        return (
            (self.stream, self.n_stream, self.layers)
            == (other.stream, other.n_stream, other.layers)
            and len(self.parts) == len(other.parts)
            and all(
                a[0] == b[0] and a[1] == b[1] and len(a[2]) == len(b[2])
                for a, b in zip(self.parts, other.parts, strict=True)
            )
        )

    def kept(self, valid_upto: int, n_swa: int, reach: int) -> Window:
        """The cells a later save of the slot may join to its window (`merge`): one that
        joins has its window from valid_upto - n_swa or later, and takes up to `reach`
        cells before that. Views, not copies: they keep the blob alive (the one the cache
        was handed or restored from), one per slot, where a copy would cost a few ms."""
        lo = min(max(self.first, valid_upto - n_swa - reach), self.first + self.count)
        a = lo - self.first
        parts = tuple(
            (h, u, tuple(piece[a * u :] for piece in slices)) for h, u, slices in self.parts
        )
        return Window(lo, self.count - a, self.stream, self.n_stream, self.seq_id, self.layers,
                      parts)  # fmt: skip

    def write_after(self, out: bytearray, front: Window, lo: int, hi: int) -> None:
        """Write this section into `out` with cells lo..hi-1 of `front` before its own
        (hi: this one's first; same layout)."""
        out += struct.pack("<I", self.n_stream)
        for stream in range(self.n_stream):
            if stream != self.stream:
                out += struct.pack("<I", 0)
                continue
            out += struct.pack("<I", self.count + hi - lo)
            for pos in range(lo, self.first + self.count):
                out += struct.pack("<iI", pos, 1) + self.seq_id
            out += self.layers
            a, b = lo - front.first, hi - front.first
            for (header, unit, slices), old in zip(self.parts, front.parts, strict=True):
                out += header
                for piece, before in zip(slices, old[2], strict=True):
                    out += before[a * unit : b * unit]
                    out += piece


def split(state: bytes) -> tuple[memoryview, Window, memoryview] | None:
    """The blob as (what comes before its window section, that section, what follows:
    a hybrid's recurrent state); None: a layout this does not read."""
    data = memoryview(state)
    try:
        at = _skip_section(data, HEAD)
        window, end = _window(data, at)
    except (Unknown, struct.error):
        return None
    return data[:at], window, data[end:]


def window_start(state: bytes) -> int | None:
    """The first position the blob holds window cells for (None: unknown layout)."""
    parts = split(state)
    return parts[1].first if parts is not None else None


def merge(
    state: bytes, kept: Window | None, valid_upto: int, reach: int
) -> tuple[bytes, Window | None]:
    """`state` (just written from a slot) with its window reaching back up to `reach`
    positions before its own, from `kept` (the window cells an earlier blob of this slot
    held, of which the slot still holds positions below `valid_upto` as they were); the
    state unchanged where `kept` does not join it. Also the window of what is returned."""
    parts = split(state)
    if parts is None:
        return state, None
    before, window, after = parts
    if kept is None:
        return state, window
    want = max(kept.first, window.first - reach)
    joins = kept.first + kept.count >= window.first and valid_upto >= window.first
    if want >= window.first or not joins or not kept.fits(window):
        return state, window
    out = bytearray(before)  # one copy of the blob; handed on as get_seq_state's bytes are
    window.write_after(out, kept, want, window.first)
    out += after
    merged = split(cast(bytes, out))
    return cast(bytes, out), merged[1] if merged is not None else None


def _skip_section(data: memoryview, at: int) -> int:
    """Where the cache section starting at `at` ends (the full-attention cache's)."""
    (n_stream,) = struct.unpack_from("<I", data, at)
    if not 0 < n_stream <= 4096:
        raise Unknown("stream count")
    at += 4
    for _ in range(n_stream):
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        if count:
            _, at = read_cells(data, at, count)
            _, at = _rows(data, at, count)
    return at


def _window(data: memoryview, at: int) -> tuple[Window, int]:
    (n_stream,) = struct.unpack_from("<I", data, at)
    if not 0 < n_stream <= 4096:
        raise Unknown("stream count")
    at += 4
    found: Window | None = None
    for stream in range(n_stream):
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        if count == 0:
            continue
        if found is not None:
            raise Unknown("cells in two streams")
        first, cells_end = read_cells(data, at, count)
        seq_id = bytes(data[at + 8 : at + 12])
        layers = bytes(data[cells_end : cells_end + 8])
        parts, at = _rows(data, cells_end, count)
        found = Window(first, count, stream, n_stream, seq_id, layers, parts)
    if found is None:
        raise Unknown("no window cells")
    return found, at


def _rows(data: memoryview, at: int, count: int) -> tuple[tuple[_Part, ...], int]:
    """The K and V data of `count` cells: per layer, K rows then V (rows, or transposed:
    per embedding row, an element per cell)."""
    v_trans, n_layer = struct.unpack_from("<II", data, at)
    if v_trans > 1 or n_layer > 4096:
        raise Unknown("layers")
    at += 8
    parts: list[_Part] = []
    for _ in range(2 if not v_trans else 1):
        for _ in range(n_layer):
            _, unit = struct.unpack_from("<iQ", data, at)
            header = bytes(data[at : at + 12])
            at += 12
            parts.append((header, unit, (_take(data, at, count * unit),)))
            at += count * unit
    if v_trans:
        for _ in range(n_layer):
            _, unit, n_embd = struct.unpack_from("<iII", data, at)
            header = bytes(data[at : at + 12])
            at += 12
            slices = []
            for _ in range(n_embd):
                slices.append(_take(data, at, count * unit))
                at += count * unit
            parts.append((header, unit, tuple(slices)))
    return tuple(parts), at


def _take(data: memoryview, at: int, size: int) -> memoryview:
    if at + size > len(data):
        raise Unknown("short")
    return data[at : at + size]
