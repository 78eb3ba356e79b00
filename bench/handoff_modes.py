"""Where a token's Python may go on a machine whose cores llama.cpp's threads fill.

    python bench/handoff_modes.py [--tokens 1800] [--engine-us 200] [--consumer-us 200]

A bare greedy decode loop (the bundled model, the engine's context settings, 2 threads)
spends a fixed amount of Python after each token, as the engine's step does, and hands the
token to a consumer that spends a fixed amount more, as the event loop does with a
streamed token. The consumer runs, by turns of 20 tokens in one run (this machine drifts
by more than the differences between runs):

- bare: there is none (the engine's Python alone);
- inline: the decode thread itself, no hand-off;
- thread: an asyncio loop in the main thread, woken by `call_soon_threadsafe`, as kvserve's
  event loop is (the GIL makes its work and the decode thread's take turns);
- thread_keep_gil: the same loop, woken by a write to its self-pipe through libc with the
  GIL held (ctypes.PyDLL), so that the decode thread goes on and the loop's work runs
  during the next decode instead of before it;
- process: an asyncio loop in a child process, woken through a pipe after the engine's
  Python (no shared GIL);
- process_early: the same, woken before the engine's Python, so that its work can run
  beside it on the other core, where llama.cpp's idle OpenMP thread spins.

It prints each mode's median and mean time per token. The differences are what a hand-off
and a second process cost or save; the decode itself is the same in every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.llama import Batch, Context, ContextParams, Model  # noqa: E402
from server.config.tree import default_model_path  # noqa: E402

MODES = ("bare", "inline", "thread", "thread_keep_gil", "process", "process_early")
BLOCK = 20  # tokens a mode runs before the next one takes over


def python_work(iterations: int, token: int) -> str:
    """Allocating Python, as a step's bookkeeping or a stream chunk's JSON is."""
    out = ""
    for i in range(iterations):
        out = json.dumps({"index": 0, "delta": {"content": str(token + i)}, "finish": None})
    return out


def iterations_for(us: float) -> int:
    """How many rounds of `python_work` take `us` microseconds here, warm."""
    began = time.perf_counter()
    python_work(10_000, 1)
    per_round = (time.perf_counter() - began) / 10_000 * 1e6
    return max(1, round(us / per_round))


def mode_of(token: int) -> str:
    return MODES[(token // BLOCK) % len(MODES)]


def decode_loop(n: int, engine_work: int, deliver: Callable[[int, int, bool], None]) -> list[float]:
    """Greedy single-row decodes of one sequence; the wall time from each token to the next."""
    model = Model(os.environ.get("KVSERVE_BENCH_MODEL") or default_model_path())
    ctx = Context(model, ContextParams(n_ctx=4096 * 8, n_batch=512, n_seq_max=8, n_threads=2))
    prompt = model.tokenize("Write a long story about a cat named Tom.", add_special=True,
                            parse_special=False)  # fmt: skip
    batch = Batch(512)
    batch.add(3, prompt, 0, True)
    if ctx.decode(batch) != 0:
        raise RuntimeError("llama_decode failed")
    position, token, gaps, last = len(prompt), 42, [], None
    for i in range(n):
        batch.clear()
        batch.add(3, [token], position, True)
        if ctx.decode(batch) != 0:
            raise RuntimeError("llama_decode failed")
        token = int(ctx.logits_row(0).argmax())
        position += 1
        deliver(i, token, True)
        python_work(engine_work, token)
        deliver(i, token, False)
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    return gaps


def consume_pipe(fd: int, work: int) -> None:
    """The child process: an asyncio loop that reads tokens from `fd` until it closes."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def readable() -> None:
            data = os.read(fd, 4096)
            if not data:
                loop.remove_reader(fd)
                finished.set_result(None)
                return
            for i in range(0, len(data), 4):
                python_work(work, int.from_bytes(data[i : i + 4], "little"))

        loop.add_reader(fd, readable)
        await finished

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1800)
    parser.add_argument("--engine-us", type=float, default=200.0)
    parser.add_argument("--consumer-us", type=float, default=200.0)
    args = parser.parse_args()
    engine_work, consumer_work = iterations_for(args.engine_us), iterations_for(args.consumer_us)

    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        consume_pipe(read_end, consumer_work)
        os._exit(0)
    os.close(read_end)

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[float]] = loop.create_future()
        libc = ctypes.PyDLL(None)  # a call through PyDLL keeps the GIL
        self_pipe = loop._csock.fileno()  # type: ignore[attr-defined]

        def deliver(i: int, token: int, early: bool) -> None:
            mode = mode_of(i)
            if early != mode.endswith("_early"):
                return
            if mode == "inline":
                python_work(consumer_work, token)
            elif mode == "thread":
                loop.call_soon_threadsafe(python_work, consumer_work, token)
            elif mode == "thread_keep_gil":
                loop._call_soon(python_work, (consumer_work, token), None)  # type: ignore[attr-defined]
                libc.write(self_pipe, b"\0", 1)
            elif mode.startswith("process"):
                os.write(write_end, token.to_bytes(4, "little"))

        def decode() -> None:
            gaps = decode_loop(args.tokens, engine_work, deliver)
            loop.call_soon_threadsafe(done.set_result, gaps)

        threading.Thread(target=decode, daemon=True).start()
        return await done

    gaps = asyncio.run(run())
    os.close(write_end)
    os.waitpid(child, 0)
    by_mode: dict[str, list[float]] = {mode: [] for mode in MODES}
    for k, gap in enumerate(gaps):  # gap k ends at token k + 1, in that token's mode
        if (k + 1) % BLOCK > 1:  # a turn's first two gaps straddle two modes
            by_mode[mode_of(k + 1)].append(gap * 1000)
    medians = {m: round(statistics.median(v), 3) for m, v in by_mode.items()}
    means = {m: round(statistics.mean(v), 3) for m, v in by_mode.items()}
    print(json.dumps({"engine_us": args.engine_us, "consumer_us": args.consumer_us,
                      "median_ms": medians, "mean_ms": means}))  # fmt: skip


if __name__ == "__main__":
    main()
