"""What a stream's lane is to the engine (engine/thread/lanes.py runs it; the server's
is server/serving/wire.py).

One streamed token's hand-off to the event loop costs more than its bytes
(docs/benchmarks.md, "A token's lane"): a lane writes them from the engine thread. An
output whose text a lane wrote reaches the reader marked `SeqOutput.written`: it folds
it into its totals and sends nothing for it."""

from __future__ import annotations

from typing import Protocol

from engine.types import SeqOutput


class Lane(Protocol):
    """A stream's way to the client that skips the event loop: the engine thread offers
    it an output of the sequence, and it writes what it can itself.

    Order: the engine offers an output only once the reader has sent every output it
    was handed before (not written by the lane), from the sequence's first on, so
    nothing the lane writes overtakes what the loop still has to send. `paid` is the
    reader's count of those (event loop: set when it has sent all it received)."""

    paid: int

    def offer(self, output: SeqOutput) -> bool:
        """Engine thread: True if the output's bytes went to the client."""
        ...
