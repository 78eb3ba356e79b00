"""A request's thinking budget and its template's thinking block -> the engine's
`ThinkingSpec` (engine/thinking.py): the one place every API's field becomes a budget.

The budget comes from each API's own field (Chat: llama-server's
`reasoning_budget_tokens` / `thinking_budget_tokens`; Messages: `thinking.budget_tokens`),
else 0 when the request turns thinking off (an `enable_thinking` of false: effort
"none"/"minimal", Messages' `thinking: disabled`, Ollama's `think: false`, so a template
without the switch is held to it too), else None: the model's `[engine]
reasoning_budget`. The template's tags (chat/reasoning.py `thinking_syntax`) are
tokenized here by the engine's tokenizer; a template without a thinking block gets no
spec: the budget is a no-op there, logged, never a 400. A spec with an unlimited budget
still goes down: the engine counts the thinking tokens for the usage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from chat.reasoning import thinking_syntax
from engine.client import EngineLike, ThinkingSpec

log = logging.getLogger("kvserve.server")


def thinking_spec(
    engine: EngineLike,
    template_source: str,
    prompt: str,
    budget: int | None,
    template_kwargs: Mapping[str, object],
) -> ThinkingSpec | None:
    """The spec of a request rendered to `prompt` with `template_kwargs`; `budget`: the
    request's own (None: none named, -1 already read as None by the protocol)."""
    syntax = thinking_syntax(template_source)
    if syntax is None:
        if budget is not None:
            log.info("thinking budget %d: a no-op, the template has no thinking block", budget)
        return None
    if budget is None and template_kwargs.get("enable_thinking") is False:
        budget = 0

    def ids(tag: str) -> tuple[int, ...]:
        return tuple(engine.tokenize(tag, add_special=False, parse_special=True))

    return ThinkingSpec(ids(syntax.open), ids(syntax.close), syntax.starts_inside(prompt), budget)
