"""Context overflow for chat: refuse (400 `context_length_exceeded`, the default) or,
with a model's `context_overflow = "drop_oldest"`, drop the oldest turns after the
system messages until the prompt and `max_tokens` fit. The response says how many
messages went in the `X-Kvserve-Dropped-Messages` header."""

from __future__ import annotations

from typing import Any

from chat import ChatOptions, ChatPlan, ChatTemplate, plan_chat
from server.deps import EngineLike
from server.serving.drive import tokenize

DROPPED_HEADER = "X-Kvserve-Dropped-Messages"
OVERFLOW_MODES = ("error", "drop_oldest")


async def plan_within_context(
    engine: EngineLike,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    opts: ChatOptions,
    max_tokens: int | None,
    overflow: str,
) -> tuple[ChatPlan, list[int], int]:
    """The plan, its prompt tokens, and how many messages were dropped to fit. What
    still does not fit is left to the engine's 400."""
    dropped = 0
    while True:
        plan = plan_chat(template, messages, opts)
        rendered = plan.prompt
        prompt = await tokenize(
            engine, rendered.text, add_special=rendered.add_bos, parse_special=True
        )
        if overflow != "drop_oldest" or len(prompt) + (max_tokens or 1) <= engine.info.n_ctx:
            return plan, prompt, dropped
        shorter = drop_oldest_turn(messages)
        if shorter is None:
            return plan, prompt, dropped
        dropped += len(messages) - len(shorter)
        messages = shorter


def drop_oldest_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Without the oldest turn after the leading system messages: a user message and
    everything up to the next user message (its answer, tool calls and tool results go
    together, so no result loses its call). None when only the last turn is left."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    following = next(
        (i for i in range(start + 1, len(messages)) if messages[i]["role"] == "user"), None
    )
    if following is None:
        return None
    return messages[:start] + messages[following:]
