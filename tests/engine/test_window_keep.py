"""engine/thread/window_keep.py and its use, without a model (issue 49): under exact reuse a
window's state saved at a prompt's end carries the window cells of the slot's earlier
blob that join its own, so it can be cut back to a later turn's reuse limit; the lookup
reaches that far and looks again where it found a state that cannot be cut back; and
nothing of it where the window is shorter than the recomputed rows."""

from __future__ import annotations

import struct
from typing import Any, cast

from cache import CacheHit
from engine.thread.kvledger import KvLedger
from engine.thread.placement import hit_floor, lookup_again, lookup_reach
from engine.thread.plan import SchedulerConfig
from engine.thread.window_keep import merge, split, window_start

HEAD = struct.pack("<Ii", 0xAF143CD8, 3)


def section(first: int, count: int, *, v_trans: bool = False) -> bytes:
    """One cache's section (2 streams, the first empty), one layer whose cell data is
    its position: K a 4-byte row, V a 4-byte row or 2 embedding rows of 2 bytes."""
    cells = b"".join(struct.pack("<iIi", first + i, 1, 3) for i in range(count))
    data = struct.pack("<II", int(v_trans), 1)
    data += struct.pack("<iQ", 1, 4) + b"".join(struct.pack("<i", first + i) for i in range(count))
    if v_trans:
        elements = b"".join(struct.pack("<h", first + i) for i in range(count))
        data += struct.pack("<iII", 1, 2, 2) + elements + elements
    else:
        data += struct.pack("<iQ", 1, 4) + b"".join(
            struct.pack("<i", -first - i) for i in range(count)
        )
    return struct.pack("<II", 2, 0) + struct.pack("<I", count) + cells + data


def blob(length: int, window: int, first: int | None = None, **kw: bool) -> bytes:
    """A state of `length` positions: full attention 0.., window cells from `first`
    (default: its last `window`), then a hybrid's tail."""
    start = length - window if first is None else first
    return HEAD + section(0, length, **kw) + section(start, length - start, **kw) + b"tail"


def test_the_end_state_gets_the_checkpoints_window_cells_in_front() -> None:
    for v_trans in (False, True):
        checkpoint = split(blob(100, 80, v_trans=v_trans))  # window 20..99
        assert checkpoint is not None and checkpoint[1].first == 20
        state, window = merge(blob(164, 80, v_trans=v_trans), checkpoint[1], 100, reach=68)
        # Its own window was 84..163: the merge reaches back 68, to 16, but the
        # checkpoint's cells start at 20: every cell 20..163 is there, as a blob of them.
        assert state == blob(164, 80, first=20, v_trans=v_trans)
        assert window is not None and (window.first, window.count) == (20, 144)
        assert window_start(state) == 20


def test_the_merge_reaches_back_no_further_than_asked() -> None:
    old = split(blob(300, 290))  # window 10..299
    assert old is not None
    state, _ = merge(blob(364, 80), old[1], 300, reach=68)
    assert window_start(state) == 284 - 68


def test_cells_that_do_not_join_or_were_cut_are_not_used() -> None:
    far = split(blob(100, 20))  # window 80..99; the end's starts at 184
    assert far is not None
    end = blob(264, 80)
    assert merge(end, far[1], 100, reach=68)[0] == end  # a gap: as it is
    near = split(blob(200, 80))  # window 120..199 joins 184..
    assert near is not None
    assert merge(end, near[1], 150, reach=68)[0] == end  # but the slot was cut to 150
    assert window_start(merge(end, near[1], 200, reach=68)[0]) == 120  # all it has
    other = split(blob(200, 80, v_trans=True))  # another layout of cells' data
    assert other is not None and merge(end, other[1], 200, reach=68)[0] == end
    assert merge(b"not a state", near[1], 200, reach=68) == (b"not a state", None)


def config(n_swa: int, **kw: Any) -> SchedulerConfig:
    base: dict[str, Any] = dict(exact=True, exact_min_rows=64, n_swa=n_swa, checkpoint_tokens=32)
    return SchedulerConfig(1, 4096, 4096, 512, 256, **{**base, **kw})


def test_only_a_window_over_the_recomputed_rows_is_recut() -> None:
    assert config(128).window_recut == 68
    assert config(68).window_recut == 68
    assert config(32).window_recut == 0  # the tail checkpoint's cells end before the end's
    assert config(128, exact=False).window_recut == 0  # the default mode: untouched
    assert config(128, whole_state=True).window_recut == 0  # a recurrent state: never cut
    assert config(0).window_recut == 0


def test_the_lookup_reaches_the_previous_turns_end_and_looks_again_if_it_cannot_be_cut() -> None:
    windowed, short = config(128), config(32)
    # A turn of 330 after one of 300 (limit 236): its own limit is 264.
    assert lookup_reach(330, short) == 265
    assert lookup_reach(330, windowed) == 330  # the 68 more reach past any prompt's end
    merged = CacheHit(tuple(range(300)), blob(300, 128, first=236 - 128), 300, "ram")
    assert hit_floor(merged, windowed) == 235  # cut anywhere from 235 up
    assert lookup_again(merged, 330, windowed) == 0
    plain = CacheHit(tuple(range(300)), blob(300, 128), 300, "ram")
    assert hit_floor(plain, windowed) == 299
    assert lookup_again(plain, 330, windowed) == 265  # the checkpoint at 236 serves
    shorter = CacheHit(tuple(range(236)), blob(236, 128), 236, "ram")
    assert lookup_again(shorter, 330, windowed) == 0  # within the plain reach already


class Memory:
    """llama.cpp's memory as the ledger uses it: one sequence, blobs given back as set."""

    def __init__(self) -> None:
        self.state = b""
        self.max = -1

    def get_seq_state(self, slot: int) -> bytes:
        return self.state

    def set_seq_state(self, slot: int, state: bytes) -> bool:
        self.state, self.max = state, 99
        return True

    def remove_seq(self, slot: int, start: int = 0, end: int = -1) -> bool:
        self.max = start - 1
        return True

    def seq_pos_min(self, slot: int) -> int:
        return 0  # the zero cells a cold layout puts below the window count as held

    def seq_pos_max(self, slot: int) -> int:
        return self.max


def test_the_ledger_merges_a_save_with_the_restored_window_and_guards_its_cuts() -> None:
    memory = Memory()
    ledger = KvLedger(cast(Any, memory), 1, n_swa=80, cold_cells=True, recut=68)
    assert ledger.restore(0, blob(100, 80), list(range(100)))  # window 20..99
    assert not ledger.cut(0, 60)  # its window would start at 0: below the cells held
    assert ledger.restore(0, blob(100, 80), list(range(100)))
    assert ledger.cut(0, 99)  # its window starts at 20
    ledger.slots[0].extend(range(99, 164))  # the prompt's tail computed
    memory.state = blob(164, 80)  # as llama.cpp writes it: window 84..163
    assert window_start(ledger.saved_state(0)) == 20
    ledger.remove_seq(0)  # dropped: nothing of it is merged into a later state
    assert ledger.saved_state(0) == blob(164, 80)
