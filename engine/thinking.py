"""A thinking budget: the tokens a sequence generates inside its thinking block are
counted, and once the budget is spent the block's close is forced, as if sampled; the
answer follows. Pure Python, no llama.cpp: postprocess asks `ThinkingBudget` what is
due and appends it (engine/thread/postprocess.py), the worker feeds it to the sampler.

The reference is llama.cpp's reasoning budget (common/reasoning-budget.cpp, used by
llama-server's `--reasoning-budget` and per-request `thinking_budget_tokens`): the
opening and closing are token sequences (the server tokenizes the template's tags),
matched on the tokens as generated; once inside, every token that does not complete the
close counts; at N the close is forced, after the character in progress is whole (a
multi-byte character split over tokens is never cut); a new opening after a close gets
a fresh budget. Two differences: a close the model had begun (`</` sampled as the N-th
token) is completed rather than written again, and the forced tokens are appended in one
go (computed as one chunk in the next step) rather than sampled one per step through a
masked distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class ThinkingSpec:
    """A request's thinking block: how it opens and closes (token ids), whether the
    prompt leaves the model inside one (a template that opens it in the generation
    prompt), and the budget: None for the engine's default (`[engine]
    reasoning_budget`), -1 unlimited (counted only), 0 closed at once."""

    open: tuple[int, ...]
    close: tuple[int, ...]
    inside: bool = False
    budget: int | None = None


class ThinkingBudget:
    """One sequence's thinking state: inside a block or not, the tokens used in the
    current block, and every token of every block (tags included) for the usage's
    reasoning_tokens. Fed each generated token in order, sampled or forced."""

    __slots__ = ("open", "close", "budget", "inside", "used", "num_tokens", "_recent")

    def __init__(self, spec: ThinkingSpec, budget: int):
        self.open, self.close = spec.open, spec.close
        self.budget = budget
        self.inside = spec.inside
        self.used = 0  # tokens generated in the current block after its opening
        self.num_tokens = 0
        self._recent: list[int] = []  # the last tokens: enough to match either tag

    @classmethod
    def of(cls, spec: ThinkingSpec | None, *, default: int, free: bool) -> ThinkingBudget | None:
        """The budget a request runs with: its own, else `default`. `free`: nothing
        may be forced into its output (a grammar that constrains from the first token
        owns it), so it is counted only."""
        if spec is None:
            return None
        budget = default if spec.budget is None else spec.budget
        return cls(spec, budget if free else UNLIMITED)

    def accept(self, token: int) -> None:
        """A token generated (sampled, or forced by `due`)."""
        self._recent.append(token)
        del self._recent[: -max(len(self.open), len(self.close))]
        if self.inside:
            self.num_tokens += 1
            if self._ends_with(self.close):
                self.inside, self.used = False, 0
            else:
                self.used += 1
        elif self._ends_with(self.open):
            self.inside, self.used = True, 0
            self.num_tokens += len(self.open)  # its tokens were generated outside, until now

    def due(self, *, whole_character: bool = True) -> tuple[int, ...]:
        """The tokens to force now: the rest of the close, once the budget is spent and
        the text so far ends on a whole character; else ()."""
        if not self.inside or self.budget < 0 or self.used < self.budget or not whole_character:
            return ()
        return self.close[self._begun(self.close) :]

    def draft_room(self) -> int | None:
        """The most draft tokens a step may verify after the pending one (speculative
        decoding), so that the budget can run out on the step's last token only: what
        is sampled after a forced close would be a token ahead of the sequence. None:
        no limit (unlimited)."""
        if self.budget < 0:
            return None
        if self.inside:  # the (budget - used)-th token from now spends it
            return max(0, self.budget - self.used - 1)
        return self.budget  # an opening (1+ tokens) and then `budget` tokens

    def _ends_with(self, tag: tuple[int, ...]) -> bool:
        return bool(tag) and tuple(self._recent[-len(tag) :]) == tag

    def _begun(self, tag: tuple[int, ...]) -> int:
        """How many of `tag`'s first tokens the last tokens already are (a close the
        model had begun when the budget ran out)."""
        for k in range(min(len(tag) - 1, len(self._recent), self.used), 0, -1):
            if tuple(self._recent[-k:]) == tag[:k]:
                return k
        return 0


def constrained_from_start(grammar: str | None, lazy: bool) -> bool:
    """A grammar that constrains from the first token (not a lazy one): it owns the
    whole output, so no close is forced into it (the budget only counts)."""
    return grammar is not None and not lazy
