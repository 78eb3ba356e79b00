"""What an exact warm start reuses, as the tests state it (engine/placement.reuse_limit)."""

from __future__ import annotations


def reused(num_tokens: int, rows: int = 64) -> int:
    """The prompt tokens an exact-reuse warm start of `num_tokens` keeps: all but the last
    `rows`, down to a multiple of 4 (a block of repacked weights' rows: engine/exact_rules.py)."""
    return (num_tokens - rows) // 4 * 4
