"""engine/thread/window_blob.py without a model: a blob written as llama.cpp writes an iswa
cache's sequence state gets zero cells for the positions under its window, in front of
the window's, and anything laid out otherwise is refused (None)."""

from __future__ import annotations

import struct

from engine.thread.window_blob import at_cold_cells

ROW = 4  # bytes of one cell's K (and V) row in one layer


def section(first: int, count: int, fill: int, *, v_trans: bool = False) -> bytes:
    """One cache's section: 2 streams (the second empty), `count` cells from `first`,
    one layer."""
    cells = b"".join(struct.pack("<iIi", first + i, 1, 0) for i in range(count))
    data = struct.pack("<II", int(v_trans), 1)
    data += struct.pack("<iQ", 1, ROW) + bytes([fill]) * (count * ROW)  # K
    if v_trans:  # V by embedding row (2 rows of 2-byte elements)
        data += struct.pack("<iII", 1, 2, 2) + bytes([fill + 1]) * (2 * count * 2)
    else:
        data += struct.pack("<iQ", 1, ROW) + bytes([fill + 1]) * (count * ROW)
    return struct.pack("<II", 2, count) + cells + data + struct.pack("<I", 0)


def test_the_window_gets_zero_cells_for_the_positions_below_it() -> None:
    head = struct.pack("<Ii", 0xAF143CD8, 0)
    base, window = section(0, 10, 7), section(6, 4, 9)  # positions 0..9; window 6..9
    recurrent = b"recurrent state"
    padded = at_cold_cells(head + base + window + recurrent)
    expected = head + base  # then the window with zero cells for positions 0..5
    cells = b"".join(struct.pack("<iIi", i, 1, 0) for i in range(10))
    data = struct.pack("<II", 0, 1) + struct.pack("<iQ", 1, ROW) + bytes(6 * ROW)
    data += bytes([9]) * (4 * ROW) + struct.pack("<iQ", 1, ROW) + bytes(6 * ROW)
    data += bytes([10]) * (4 * ROW)
    expected += struct.pack("<II", 2, 10) + cells + data + struct.pack("<I", 0) + recurrent
    assert padded == expected


def test_a_transposed_v_gets_zeros_before_each_embedding_row() -> None:
    head = struct.pack("<Ii", 0xAF143CD8, 0)
    padded = at_cold_cells(head + section(0, 3, 1, v_trans=True) + section(1, 2, 5, v_trans=True))
    assert padded is not None
    v_rows = padded[-(4 + 2 * 3 * 2) : -4]  # 2 embedding rows of 3 cells, 2 bytes each
    assert v_rows == (bytes(2) + bytes([6]) * 4) * 2


def test_a_layout_it_does_not_know_is_refused() -> None:
    head = struct.pack("<Ii", 0xAF143CD8, 0)
    base, window = section(0, 10, 7), section(6, 4, 9)
    assert at_cold_cells(head + base) is None  # no window section
    assert at_cold_cells(head + section(2, 8, 7) + window) is None  # base not from 0
    gap = window.replace(struct.pack("<iIi", 8, 1, 0), struct.pack("<iIi", 12, 1, 0))
    assert at_cold_cells(head + base + gap) is None  # window cells not consecutive
    assert at_cold_cells(head + base + window[:-9]) is None  # cut short
