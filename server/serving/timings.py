"""llama-server's reply extras on OpenAI's chat and completions: the `timings` object
(`timings_per_token: true`) and the generated token ids (`return_tokens: true`).

`timings` is llama-server's object, by its names and rules (tools/server/server-common.cpp
`server_slot_stats::to_json`): cache_n prompt tokens reused, prompt_n computed in
prompt_ms (from the request's first step to its whole prompt being in the KV cache),
predicted_n tokens generated, predicted_ms from the prompt's end to the last token. The
first token comes from the prompt's last step, so the per-token and per-second figures
of generation count predicted_n - 1 steps, as llama-server counts them. With n > 1 (or
several prompts) the object covers every choice: the counts are usage's, the times run
from the first choice's start to the last one's end. The engine measures a sequence's
stage times when it finishes (engine.client.Timings), so kvserve sends `timings` once,
with the reply (a stream: on its last chunk), where llama-server with
`timings_per_token` also puts running figures on every chunk.
"""

from __future__ import annotations

import json
from typing import Any

from server.serving.state import Choice, usage


def timings(choices: list[Choice], num_prompt_tokens: int) -> dict[str, Any] | None:
    """The `timings` object of a reply's choices (None: the engine timed none of them)."""
    timed = [c for c in choices if c.timings is not None]
    if not timed:
        return None
    counts = usage(choices, num_prompt_tokens)
    cache_n = counts["prompt_tokens_details"]["cached_tokens"]
    prompt_n = max(0, num_prompt_tokens - cache_n)
    predicted_n = counts["completion_tokens"]
    stages = [c.timings for c in timed if c.timings is not None]
    start = min(t.scheduled or t.arrival for t in stages)
    prompt_done = [t.prompt_done for t in stages if t.prompt_done is not None]
    ends = [t.finished or c.finished_at for c, t in zip(timed, stages, strict=True)]
    prompt_ms = (max(prompt_done) - start) * 1e3 if prompt_done else 0.0
    predicted_ms = max(0.0, (max(ends) - min(prompt_done)) * 1e3) if prompt_done else 0.0
    steps = max(0, predicted_n - len(timed))  # each choice's first token is the prompt's
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 * steps / predicted_ms if predicted_ms > 0 else 0.0,
    }


def with_timings(chunk: str, value: dict[str, Any] | None) -> str:
    """A stream chunk's JSON text (sse.chunk_framing's) with `timings` added."""
    if value is None:
        return chunk
    return chunk[:-1] + ',"timings":' + json.dumps(value) + "}"
