"""What llama.cpp's full-size sliding-window cache costs against a window-sized one.

    python bench/swa_memory.py [MODEL.gguf] [--n-ctx 4096] [--slots 4]

kvserve keeps every cell of a sliding-window model's window layers (swa_full, the
default: engine/llama/context.py), so a slot, a restored state or a fork can be cut back
to any prefix. A window-sized cache keeps only about the last n_swa + n_ubatch positions
of those layers: less memory, but a sequence can then be cut back only within what it
still holds, and reuse of anything older needs saved checkpoints (llama-server's way).
This prints the KV buffer size llama.cpp reports for both, per slot, the size of one
sequence's saved state after a `--prompt`-token prompt (what the prefix cache stores), with
the state's smallest position (0: every cell is there), and the prefill rate of that
prompt: the window layers of a full-size cache attend over every cell (masked), so the
rate falls as the prompt grows. The rate is the better of two sequences' prefills (the
first warms the process up); run it alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.llama import Batch, Context, ContextParams, Model  # noqa: E402


class _Sizes(logging.Handler):
    """llama.cpp's "llama_kv_cache: size = N MiB" lines, as they are logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.mib: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", record.getMessage())
        if found:
            self.mib.append(float(found.group(1)))


def measure(
    model: Model, swa_full: bool, n_ctx: int, slots: int, length: int
) -> tuple[float, int, int, float]:
    sizes = _Sizes()
    logger = logging.getLogger("kvserve.llama")
    logger.addHandler(sizes)
    logger.setLevel(logging.INFO)
    try:
        ctx = Context(model, ContextParams(n_ctx * slots, 512, slots, 2, swa_full=swa_full))
    finally:
        logger.removeHandler(sizes)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(1000, min(model.n_vocab - 100, 200_000), length)]
    batch = Batch(512)
    best = float("inf")
    for seq in (0, 1):
        began = time.perf_counter()
        for start in range(0, len(prompt), 512):
            batch.clear()
            batch.add(seq, prompt[start : start + 512], start, logits_last=False)
            if ctx.decode(batch) != 0:
                raise RuntimeError("llama_decode failed")
        best = min(best, time.perf_counter() - began)
    state = len(ctx.get_seq_state(0))
    pos_min = ctx.seq_pos_min(0)
    ctx.close()
    return sum(sizes.mib) / slots, state, pos_min, length / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", help="a GGUF (default: Gemma 3 270M of the test extra)")
    parser.add_argument("--n-ctx", type=int, default=4096, help="cells per slot")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=2000, help="prompt tokens (at most --n-ctx)")
    args = parser.parse_args()
    path = args.model
    if path is None:
        from tests.helpers.family_models import assemble_gemma3_270m

        path = str(assemble_gemma3_270m())
    model = Model(path)
    print(f"{Path(path).name}: n_swa {model.family().n_swa}, n_ctx {args.n_ctx} a slot")
    print(
        f"cache        KV MiB a slot   state after {args.prompt:,} tokens   smallest position kept"
        "   prefill tok/s"
    )
    for swa_full in (True, False):
        mib, state, pos_min, rate = measure(model, swa_full, args.n_ctx, args.slots, args.prompt)
        name = "full-size" if swa_full else "window-sized"
        print(f"{name:12} {mib:14.1f}   {state / 2**20:21.1f} MiB   {pos_min:22d}   {rate:13.0f}")


if __name__ == "__main__":
    main()
