"""What a stream's lane is to the engine (engine/thread/lanes.py runs it; the server's
is server/serving/wire.py).

One streamed token's hand-off to the event loop costs more than its bytes
(docs/benchmarks.md, "A token's lane"): a lane writes them from the engine thread."""

from __future__ import annotations

from typing import Protocol

from engine.types import SeqOutput

# `SeqOutput.lane` on a sequence with a lane: WRITTEN, its text already went to the
# client from the engine thread (the reader folds it into its totals and sends nothing);
# DECLINED, the lane left it to the reader, who sends it.
WRITTEN = "written"
DECLINED = "declined"


class Lane(Protocol):
    """A stream's way to the client that skips the event loop: the engine thread offers
    it each output of the sequence, and it writes what it can itself.

    Ordering is the lane's to keep: it may write an output only once the reader has sent
    every output the lane declined before it. `paid` is set by the reader (event loop)
    to the number of declined outputs it has received and sent."""

    paid: int

    def offer(self, output: SeqOutput) -> bool:
        """Engine thread: True if the output's bytes went to the client."""
        ...
