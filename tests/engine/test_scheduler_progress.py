"""Every prompt a scheduler admits is scheduled within a bounded number of steps, for
every configuration the scheduler accepts (an exhaustive grid, no model).

Regression: with exact reuse and a prefill room of 64..127 tokens, a prompt of
65..127 tokens waited for ever (`_chunk_length` returned 0 at every step). Exact reuse
is checked with the minimum rows of both flash attention settings (64 on, 2 off).
"""

from __future__ import annotations

import itertools
import math

import pytest

from engine.exact_rules import exact_min_chunk, exact_min_rows
from engine.thread.scheduler import Scheduler, SchedulerConfig
from tests.engine.test_scheduler import apply, seq_of

CHUNKS = (1, 2, 3, 4, 5, 6, 7, 16, 63, 64, 65, 100, 127, 128, 129, 130, 131, 200, 256)
STEPS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 64, 65, 100, 127, 128, 129, 130, 131, 200, 512)
PROMPTS = (1, 2, 3, 4, 5, 63, 64, 65, 66, 100, 126, 127, 128, 129, 130, 191, 192, 193, 256, 257,
           511)  # fmt: skip
MODES = ((False, 64), (True, exact_min_rows(True)), (True, exact_min_rows(False)))


def configs() -> list[SchedulerConfig]:
    out = []
    for slots, chunk, step, (exact, rows) in itertools.product((1, 2, 3), CHUNKS, STEPS, MODES):
        config = SchedulerConfig(
            slots, 4096 * slots, 4096, step, chunk, exact=exact, exact_min_rows=rows
        )
        try:
            Scheduler(config)
        except ValueError:
            continue  # refused at start: never serves a request
        out.append(config)
    return out


def steps_to_first_token(config: SchedulerConfig, num_prompt: int, max_steps: int) -> int:
    """Steps until the prompt samples its first token, while every other slot decodes
    for ever (the most a busy server takes from its prefill budget)."""
    s = Scheduler(config)
    for i in range(config.num_slots - 1):
        s.add(seq_of(f"busy{i}", [5, 6]))
    apply(s)
    target = seq_of("target", [(3 + i) % 50 for i in range(num_prompt)])
    s.add(target)
    for step in range(1, max_steps + 1):
        apply(s)
        if target.num_output_tokens >= 1:
            return step
    return max_steps + 1


@pytest.mark.parametrize("config", configs(), ids=lambda c: f"{c.num_slots}-{c.prefill_chunk}-"
                         f"{c.step_tokens}-{f'x{c.exact_min_rows}' if c.exact else 'f'}")  # fmt: skip
def test_every_admitted_prompt_is_scheduled_within_a_bound(config: SchedulerConfig) -> None:
    room = max(1, min(config.prefill_chunk, config.step_tokens - (config.num_slots - 1)))
    for num_prompt in PROMPTS:
        bound = 2 * math.ceil(num_prompt / room) + 1
        taken = steps_to_first_token(config, num_prompt, bound)
        assert taken <= bound, f"prompt of {num_prompt} tokens not scheduled in {bound} steps"


def test_configurations_that_could_starve_a_prompt_are_refused() -> None:
    for chunk, step in ((64, 512), (127, 512), (256, 128)):
        with pytest.raises(ValueError):
            Scheduler(SchedulerConfig(2, 8192, 4096, step, chunk, exact=True))
    least = exact_min_chunk(64)
    Scheduler(SchedulerConfig(2, 8192, 4096, least + 1, least, exact=True))
    for chunk, step in ((5, 512), (256, 6)):  # without flash attention: 2-row chunks
        with pytest.raises(ValueError):
            Scheduler(SchedulerConfig(2, 8192, 4096, step, chunk, exact=True, exact_min_rows=2))
    least = exact_min_chunk(2)  # 2 x 2 rows, and a block's worth of room
    Scheduler(SchedulerConfig(2, 8192, 4096, least + 1, least, exact=True, exact_min_rows=2))
