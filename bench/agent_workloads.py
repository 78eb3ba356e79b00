"""The agents benchmark's workload: a shared tool catalogue, a task per agent, a tool
result per turn, and the named shapes bench/agents.py runs (`--shape NAME`).

Words are syllable pairs (one or two tokens each with SmolLM2's tokenizer, about 2.7
tokens a word in the catalogue's JSON, 2.9 characters a token), so a shape's size is set
in words and its token count follows; tests/test_bench_workloads.py checks that each
shape's catalogue lands in the token range it claims.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# Plain English-like words, one or two tokens each: syllable pairs.
HEADS = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "bel", "cor", "dan", "fen")
TAILS = ("ber", "den", "ga", "lin", "mo", "nor", "ra", "son", "ta", "vel")
WORDS = [h + t for h in HEADS for t in TAILS]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def catalogue(rng: random.Random, target_words: int) -> str:
    """Tool definitions as JSON lines, about `target_words` words in all."""
    lines, total, i = [], 0, 0
    while total < target_words:
        tool = {
            "name": f"tool_{i}_{rng.choice(WORDS)}",
            "description": words(rng, 18),
            "parameters": {
                "type": "object",
                "properties": {rng.choice(WORDS): {"type": "string"} for _ in range(3)},
            },
        }
        line = json.dumps(tool)
        lines.append(line)
        total += len(line.split()) + 6
        i += 1
    return "You are an agent. Call tools by name. Available tools:\n" + "\n".join(lines)


@dataclass(frozen=True)
class Shape:
    """One named workload. `catalogue_tokens` is the range the catalogue's token count
    must fall in (SmolLM2's tokenizer); `n_ctx` is the context of one slot, on every
    server, sized to hold the last turn's prompt and reply with room to spare;
    `disk_cache`: kvserve runs with its disk tier (a fresh directory per run) beside the
    RAM tier, for shapes whose saved states outgrow RAM."""

    agents: int
    turns: int
    slots: int
    catalogue_words: int
    catalogue_tokens: tuple[int, int]
    task_words: int = 75  # about 160 tokens
    result_words: int = 20  # about 42 tokens
    reply_tokens: int = 24
    n_ctx: int = 4096
    disk_cache: bool = False
    about: str = ""


SHAPES: dict[str, Shape] = {
    # issue 30's reference shape (its first table): ~1,100-token prompts
    "default": Shape(16, 4, 4, 300, (700, 950), about="16 agents x 4 turns on 4 slots"),
    # larger shapes, kept apart from the default so a gain is checked to generalise:
    # more agents and slots, fewer turns, longer catalogues
    "large": Shape(24, 3, 6, 500, (1150, 1450), about="24 agents x 3 turns on 6 slots"),
    "wide": Shape(32, 2, 8, 800, (1900, 2300), about="32 agents x 2 turns on 8 slots"),
    # issue 30 item 3: the system prompt coding agents send (8k tokens), more agents than
    # slots, so turns 2+ find their prefix in the RAM or disk tier, not in a slot. As long
    # as SmolLM2's 8,192-token training context allows: llama-server caps a slot there
    # (an 8k catalogue made prompts of 8,241+ tokens, which it refused), so the last
    # turn's prompt is about 7.7k tokens.
    "long-catalogue": Shape(
        6,
        3,
        2,
        2900,
        (7000, 7600),
        n_ctx=8192,
        disk_cache=True,
        about="6 agents x 3 turns on 2 slots, a ~7.3k-token catalogue",
    ),  # fmt: skip
}


@dataclass
class Workload:
    system: str
    tasks: list[str]
    results: list[list[str]]  # [agent][turn - 1]: the tool result appended after each turn


def make_workload(
    seed: int, agents: int, turns: int, catalogue_words: int, task_words: int, result_words: int
) -> Workload:
    rng = random.Random(seed)
    system = catalogue(rng, catalogue_words)
    tasks = [f"Task {a}: {words(rng, task_words)}" for a in range(agents)]
    results = [
        [f"Tool result: {words(rng, result_words)}" for _ in range(turns)] for _ in range(agents)
    ]
    return Workload(system, tasks, results)


def longest_prompt_words(shape: Shape) -> int:
    """Words in the last turn's prompt, replies not counted: what n_ctx must hold."""
    return shape.catalogue_words + shape.task_words + (shape.turns - 1) * shape.result_words
