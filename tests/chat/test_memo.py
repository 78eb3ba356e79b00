"""The byte-bounded grammar memo (issue 9, item 9): bounded by bytes, not by count."""

from __future__ import annotations

import pytest

from chat import schema
from chat.memo import ByteMemo


def test_entries_are_dropped_least_recently_used_first_past_the_byte_budget() -> None:
    memo: ByteMemo[str] = ByteMemo(1000, len)
    made: list[str] = []

    def make(value: str) -> str:
        made.append(value)
        return value

    for key in ("a", "b", "c"):
        memo.get(key, lambda k=key: make(k * 200))  # 201 bytes each
    memo.get("a", lambda: make("again"))  # a hit: refreshed, not rebuilt
    assert made == ["a" * 200, "b" * 200, "c" * 200] and memo.bytes == 603
    memo.get("d", lambda: make("d" * 200))
    memo.get("e", lambda: make("e" * 200))  # 1005 bytes: b, the least recent, goes
    assert memo.bytes <= 1000 and len(memo) == 4
    memo.get("b", lambda: make("rebuilt"))
    assert made[-1] == "rebuilt"


def test_a_huge_entry_is_built_but_never_kept_and_errors_are_not_memoized() -> None:
    memo: ByteMemo[str] = ByteMemo(1000, len)
    assert memo.get("k", lambda: "x" * 300) == "x" * 300
    assert len(memo) == 0 and memo.bytes == 0

    def fail() -> str:
        raise ValueError("bad schema")

    with pytest.raises(ValueError):
        memo.get("bad", fail)
    assert len(memo) == 0


def test_schema_grammars_stay_within_the_budget() -> None:
    for i in range(50):  # schemas with a 400 KB description each: 20 MB of keys
        schema.schema_to_gbnf({"type": "object", "description": f"{i}" + "y" * 400_000})
    assert schema._GRAMMARS.bytes <= schema._GRAMMARS.max_bytes
    assert len(schema._GRAMMARS) < 50
