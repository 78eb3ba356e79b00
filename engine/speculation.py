"""Prompt-lookup drafting for speculative decoding: pure Python, no llama.cpp.

Outputs that copy spans of their input (a rewrite with small edits, fields extracted
from a document, code quoted back) can be guessed from the input itself: when the last
few tokens generated also occur earlier in the sequence, the tokens that followed them
there are a likely continuation. The step then carries the sampled token plus those
guesses as one chunk; the runner samples each row in turn and keeps the guesses up to
the first one the sampler disagrees with (see `Runner`). Every kept token is the token
plain decoding would have sampled, so greedy output is unchanged, and a sampled one is
drawn from the same distribution: a draft that does not depend on the model's
probabilities is accepted exactly when the sampler picks it.

Why this is cheap here: a chunk of fewer than 64 rows is computed with the same
kernels as a one-row decode (measured: logits identical to the last bit), and on a CPU
a few more rows in a step cost far less than another step.
"""

from __future__ import annotations

# Longest and shortest n-gram looked up (longest first: a longer match is a better guess).
NGRAM_MAX = 3
NGRAM_MIN = 2
# Draft lengths: the first guess, the cap (a chunk must stay under 64 rows, see above),
# and how many fruitless drafts in a row make the drafter pause.
DRAFT_START = 4
DRAFT_MAX = 16
MISSES_BEFORE_PAUSE = 3
PAUSE_STEPS = 16


class Drafter:
    """Proposes draft tokens for one sequence and adapts its draft length.

    `index` maps each n-gram of the sequence to the position right after its latest
    occurrence; it is extended as tokens are appended, so a proposal costs a few dict
    lookups however long the sequence is.
    """

    __slots__ = ("index", "num_indexed", "length", "misses", "paused")

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        self.num_indexed = 0  # positions whose preceding n-grams are in `index`
        self.length = DRAFT_START  # tokens to propose next time
        self.misses = 0  # drafts in a row of which nothing was accepted
        self.paused = 0  # steps left without drafting

    def propose(self, tokens: list[int], limit: int) -> tuple[int, ...]:
        """Up to `min(limit, self.length)` tokens that followed the sequence's last
        n-gram where it occurred before; () when there is none (or while paused)."""
        # Index every position but the last: the n-gram ending there is the one we look
        # up, and it must not find itself.
        end = len(tokens) - 1
        index = self.index
        for pos in range(max(self.num_indexed, NGRAM_MIN), end + 1):
            for n in range(NGRAM_MIN, min(NGRAM_MAX, pos) + 1):
                index[tuple(tokens[pos - n : pos])] = pos
        self.num_indexed = end + 1
        if self.paused:
            self.paused -= 1
            return ()
        count = min(limit, self.length)
        if count <= 0:
            return ()
        for n in range(min(NGRAM_MAX, len(tokens)), NGRAM_MIN - 1, -1):
            start = index.get(tuple(tokens[-n:]))
            if start is not None and start < len(tokens):
                draft = tokens[start : start + count]
                # An image position (id < 0, engine/media.py) is no token to propose.
                cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))
                return tuple(draft[:cut])
        return ()

    def feedback(self, drafted: int, accepted: int) -> None:
        """Grow the draft after a full acceptance, shrink it to what was accepted after
        a partial one, and pause after several drafts that gained nothing."""
        if accepted == drafted:
            self.length = min(DRAFT_MAX, self.length + DRAFT_START)
            self.misses = 0
            return
        self.length = max(1, accepted + 1)
        if accepted:
            self.misses = 0
            return
        self.misses += 1
        if self.misses >= MISSES_BEFORE_PAUSE:
            self.misses = 0
            self.length = DRAFT_START
            self.paused = PAUSE_STEPS
