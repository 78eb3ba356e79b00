"""Two turns about one image: turn 2's time to first token against turn 1's (issue 50).

    python bench/image_turns.py --servers kvserve,llama-server --rounds 5

Each server is started alone (bench/compare.py's `start`, one slot, 2 threads) with the
bundled SmolLM2-135M-Instruct and the test-made vision projector
(tests/helpers/vision_projector.py: a random-weight LLaVA "mlp" projector, 16 positions
per 64x64 image), loaded by both: kvserve through its model entry's `mmproj`
(KVSERVE_MODEL_MMPROJ), llama-server with `--mmproj`. Each round is one conversation over
OpenAI Chat, streamed, greedy: turn 1 a new picture (a data-URL PNG, another every
round, so turn 1 finds nothing of it in any cache) and after it a question of --points
points (~20 tokens each), turn 2 the reply and a follow-up. With the image's positions
reused, turn 2 computes only its new text: its TTFT should be well under turn 1's, which
encodes the image and prefills all.
The table gives per server the medians over the rounds, the ratio, and turn 2's cached
prompt tokens as each server reports them (kvserve: usage.prompt_tokens_details;
llama-server: timings.cache_n). Or pass --base-url NAME=URL for a server you started
yourself with the same model and projector.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402
from tests.helpers.vision_projector import png, projector_path  # noqa: E402

QUESTION = "What is in this picture? Describe the shapes and the colours you see."
# The question's points, after the image: turn 1 computes them (the text before the
# image would be cached from the round before), turn 2 should reuse them with the image.
POINT = "Point {}: say whether the picture shows a cat, a dog, a house or a tree, and where."
FOLLOW_UP = "Which colour covers most of it? Answer in one sentence."


@dataclass(frozen=True, slots=True)
class TurnTiming:
    ttft_s: float  # nan: no token came back
    prompt_tokens: int
    cached_tokens: int  # -1: the server did not say
    text: str = ""
    error: str = ""


def image_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(64, 64, seed)).decode()


def turn1_messages(seed: int, points: int = 20) -> list[dict[str, Any]]:
    question = " ".join([QUESTION, *(POINT.format(i) for i in range(1, points + 1))])
    content = [{"type": "image_url", "image_url": {"url": image_url(seed)}},
               {"type": "text", "text": question}]  # fmt: skip
    return [{"role": "user", "content": content}]


def turn2_messages(seed: int, reply: str, points: int = 20) -> list[dict[str, Any]]:
    return [*turn1_messages(seed, points), {"role": "assistant", "content": reply},
            {"role": "user", "content": FOLLOW_UP}]  # fmt: skip


def cached_of(event: dict[str, Any]) -> int | None:
    """A stream event's cached prompt tokens: OpenAI's usage (kvserve), or llama-server's
    timings (cache_n); None: this event does not say."""
    usage = event.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        return int(details["cached_tokens"])
    timings = event.get("timings") or {}
    if "cache_n" in timings:
        return int(timings["cache_n"])
    return None


def read_stream(lines: list[str], started: float, times: list[float]) -> TurnTiming:
    """A turn's figures from its SSE `lines` and the moment each arrived (`times`,
    perf_counter seconds; `started`: when the request was sent)."""
    ttft, text, prompt, cached = math.nan, "", 0, -1
    for line, at in zip(lines, times, strict=True):
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            if piece and math.isnan(ttft):
                ttft = at - started
            text += delta.get("content") or ""
        usage = event.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or prompt)
        found = cached_of(event)
        cached = found if found is not None else cached
    return TurnTiming(ttft, prompt, cached, text)


def turn(
    client: httpx.Client, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> TurnTiming:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    lines: list[str] = []
    times: list[float] = []
    started = time.perf_counter()
    try:
        with client.stream("POST", "/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                return TurnTiming(math.nan, 0, -1, error=f"{r.status_code}: {r.text[:200]}")
            for line in r.iter_lines():
                lines.append(line)
                times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        return TurnTiming(math.nan, 0, -1, error=repr(exc))
    return read_stream(lines, started, times)


def conversation(
    client: httpx.Client, model: str, seed: int, args: argparse.Namespace
) -> tuple[TurnTiming, TurnTiming]:
    first = turn(client, model, turn1_messages(seed, args.points), args.max_tokens)
    if first.error:
        return first, TurnTiming(math.nan, 0, -1, error="turn 1 failed")
    second = turn2_messages(seed, first.text, args.points)
    return first, turn(client, model, second, args.max_tokens)


def summarize(server: str, rounds: list[tuple[TurnTiming, TurnTiming]]) -> dict[str, Any]:
    """Medians over the rounds that answered both turns."""
    good = [(a, b) for a, b in rounds if not (a.error or b.error)]
    good = [(a, b) for a, b in good if not (math.isnan(a.ttft_s) or math.isnan(b.ttft_s))]
    failed = [t.error for pair in rounds for t in pair if t.error]

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    t1, t2 = median([a.ttft_s for a, _ in good]), median([b.ttft_s for _, b in good])
    return {
        "server": server,
        "rounds": len(good),
        "ttft_turn1_s": t1,
        "ttft_turn2_s": t2,
        "ratio": t2 / t1 if t1 and t2 is not None else None,
        "prompt_turn2": median([float(b.prompt_tokens) for _, b in good]),
        "cached_turn2": median([float(b.cached_tokens) for _, b in good if b.cached_tokens >= 0]),
        "errors": len(failed),
        "first_error": failed[0] if failed else "",
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    def num(value: float | None, fmt: str, unit: str = "") -> str:
        return "n/a" if value is None else format(value, fmt) + unit

    out = [
        "| server | rounds | turn 1 TTFT p50 | turn 2 TTFT p50 | turn 2 / turn 1 "
        "| turn 2 cached / prompt tokens | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cached = f"{num(r['cached_turn2'], '.0f')} / {num(r['prompt_turn2'], '.0f')}"
        out.append(
            f"| {r['server']} | {r['rounds']} | {num(r['ttft_turn1_s'], '.3f', ' s')} "
            f"| {num(r['ttft_turn2_s'], '.3f', ' s')} | {num(r['ratio'], '.2f', 'x')} "
            f"| {cached} | {r['errors']} |"
        )
    return out


def measure(label: str, base_url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    # A connection per request: llama-server (cpp-httplib) closes a kept-alive one after a
    # few requests, and httpx's next request on it failed "Server disconnected".
    headers = {"Connection": "close"}
    with httpx.Client(base_url=base_url, timeout=300, headers=headers) as client:
        conversation(client, model, 10_000, args)  # warm-up: loads, first encode
        rounds = [conversation(client, model, seed, args) for seed in range(1, args.rounds + 1)]
    for i, (a, b) in enumerate(rounds, 1):
        print(json.dumps({"server": label, "round": i, "turn1": a.ttft_s, "turn2": b.ttft_s,
                          "cached2": b.cached_tokens, "error": a.error or b.error}),
              file=sys.stderr)  # fmt: skip
    return summarize(label, rounds)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default="kvserve,llama-server")
    p.add_argument("--base-url", action="append", default=[], help="NAME=URL of a running server")
    p.add_argument("--rounds", type=int, default=5, help="conversations per server")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--points", type=int, default=20, help="the question's points (~20 tokens each)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    mmproj = str(projector_path())
    rows = []
    for name in [s for s in args.servers.split(",") if s]:
        proc, base_url, model_id = start(name, args.threads, 1, mmproj=mmproj)
        try:
            rows.append(measure(name, base_url, model_id, args))
        finally:
            proc.terminate()
            proc.wait(30)
    for item in args.base_url:
        label, url = item.split("=", 1)
        rows.append(measure(label, url, "SmolLM2-135M-Instruct", args))
    print(f"Two turns about one 64x64 image (projector {Path(mmproj).name}), "
          f"{args.rounds} rounds, medians:")  # fmt: skip
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
