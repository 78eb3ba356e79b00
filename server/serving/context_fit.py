"""Context overflow for chat: refuse (400 `context_length_exceeded`, the default) or,
with a model's `context_overflow = "drop_oldest"`, drop the oldest turns after the
system messages until the prompt and `max_tokens` fit. The response says how many
messages went in the `X-Kvserve-Dropped-Messages` header.

Rendering and tokenizing a long conversation takes CPU time: it runs in a worker
thread, so the event loop serves other requests meanwhile, and the cut is found in
O(log n) renders (a search over the number of dropped turns), never one per turn. A
short conversation renders inline: a thread hop would only add to its latency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from chat import ChatOptions, ChatPlan, ChatTemplate, plan_chat
from server.http.deps import EngineLike
from server.serving.drive import TOKENIZE_INLINE_CHARS

DROPPED_HEADER = "X-Kvserve-Dropped-Messages"
OVERFLOW_MODES = ("error", "drop_oldest")

Fitted = tuple[ChatPlan, list[int], int]  # the plan, its prompt tokens, messages dropped
INLINE_MESSAGES = 64  # at most this many messages (and short ones) render on the event loop


async def plan_within_context(
    engine: EngineLike,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    opts: ChatOptions,
    max_tokens: int | None,
    overflow: str,
) -> Fitted:
    """The plan, its prompt tokens, and how many messages were dropped to fit. What
    still does not fit is left to the engine's 400."""
    starts = turn_starts(messages)

    def attempt(turn: int) -> tuple[Fitted, bool]:
        """The plan that keeps the turns from `turn` on, and whether it fits."""
        kept = keep_turns_from(messages, starts, turn)
        plan = plan_chat(template, kept, opts)
        rendered = plan.prompt
        prompt = engine.tokenize(rendered.text, add_special=rendered.add_bos, parse_special=True)
        fits = len(prompt) + (max_tokens or 1) <= engine.info.n_ctx
        return (plan, prompt, len(messages) - len(kept)), fits

    def fit() -> Fitted:
        return _fewest_dropped(attempt, len(starts), overflow == "drop_oldest")

    if _is_short(messages):
        return fit()
    return await asyncio.to_thread(fit)


def _is_short(messages: list[dict[str, Any]]) -> bool:
    if len(messages) > INLINE_MESSAGES:
        return False
    chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
    return chars <= TOKENIZE_INLINE_CHARS


def _fewest_dropped(
    attempt: Callable[[int], tuple[Fitted, bool]], num_turns: int, drop: bool
) -> Fitted:
    """The attempt that keeps the most turns and fits (or keeps the last turn alone),
    if turns may be dropped; else the whole conversation's."""
    whole, fits = attempt(0)
    if fits or not drop or num_turns == 1:
        return whole
    # Fewer kept turns never make a longer prompt, so the first turn to keep is found by
    # searching: from the last turn backwards in doubling steps (a long history that
    # cannot fit is rarely rendered whole again), then by halving between the two
    # bounds. `failing` does not fit; `best` fits (or is the last turn alone).
    last = num_turns - 1
    best, fits = attempt(last)
    if not fits:
        return best
    failing, fitting, step = 0, last, 1
    while fitting - step > failing:
        candidate, fits = attempt(fitting - step)
        if not fits:
            failing = fitting - step
            break
        best, fitting, step = candidate, fitting - step, step * 2
    while fitting - failing > 1:
        middle = (failing + fitting) // 2
        candidate, fits = attempt(middle)
        if fits:
            best, fitting = candidate, middle
        else:
            failing = middle
    return best


def turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Where each turn after the leading system messages starts: the first message
    after them, then every later user message. A turn is a user message and everything
    up to the next user message (its answer, tool calls and tool results go together,
    so no result loses its call)."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    later = (i for i in range(start + 1, len(messages)) if messages[i]["role"] == "user")
    return [start, *later]


def keep_turns_from(
    messages: list[dict[str, Any]], starts: list[int], turn: int
) -> list[dict[str, Any]]:
    """The leading system messages and the turns from `turn` (an index into `starts`)
    on; the turns before it are dropped."""
    return messages[: starts[0]] + messages[starts[turn] :]
