"""What one engine step costs inside llama_decode, by the shape of the batch kvserve hands it.

    python bench/step_cost.py [--lengths 256,1024,2048] [--fa off,on] [--unified off,on]
    python bench/step_cost.py --tail --lengths 1024,2048,4096,7168
    python bench/step_cost.py --window --model GEMMA3.gguf --lengths 1024,4096,8192

`--tail` times the warm-tail choice instead (engine/thread/plan.py pad_from): on 2 sequences of
8192 cells with flash attention, a warm chunk of 20, 40 or 60 rows beside a decode row in
one llama_decode, against the 64-row tile in a decode of its own plus the decode row alone.
`--window` times a sliding-window model's choice (engine/thread/plan.py solo_rows): a prompt
chunk of 64, 128 or 256 rows beside a decode row in one llama_decode, against the chunk in
a decode of its own plus the decode row alone.

The agents benchmark spends 97% of the engine thread in llama_decode, and its wall time
depends on flash attention. This script times llama_decode alone on the bundled model,
with the engine's own context settings (4 sequences, 4096 cells each, 2 threads,
n_batch 512, weights repacked) for the step shapes that workload makes, each sequence
holding L tokens of KV first (not timed):

- decode x4: one new row for each of the 4 sequences (four agents generating);
- decode x1: one row of one sequence;
- the same rows in another order, or with a gap in the sequence ids: with a KV stream
  per sequence llama.cpp splits a batch into ubatches of consecutive increasing
  sequence ids (llama_batch_allocr::split_equal, sequential), one graph pass each;
- chunk 256: 256 prompt rows of one sequence (a prefill chunk alone);
- chunk 256 + 3: the same chunk beside one decode row of each other sequence (what a
  step looks like while a turn is admitted among generating ones);
- chunk 64 + 3: a short warm suffix beside three decoding sequences.

Every step's rows are removed again afterwards, so each repetition sees the same KV.
Median of --repeat runs after one warm-up, in ms. Run by hand on a quiet machine: two
things running at once on 2 cores make every figure meaningless.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.llama import Batch, Context, ContextParams, Model  # noqa: E402
from server.config.tree import default_model_path  # noqa: E402

N_SEQ = 4
N_CTX_SEQ = 4096
N_BATCH = 512
SHAPES: dict[str, list[tuple[int, int]]] = {  # name -> (sequence, rows) runs
    "decode x4": [(s, 1) for s in range(N_SEQ)],
    "decode x1": [(0, 1)],
    "decode x4, seqs 3,2,1,0": [(s, 1) for s in (3, 2, 1, 0)],
    "decode x3, seqs 0,2,3": [(0, 1), (2, 1), (3, 1)],
    "chunk 256": [(0, 256)],
    "chunk 256 + 3": [(0, 256), (1, 1), (2, 1), (3, 1)],
    "chunk 64 + 3": [(0, 64), (1, 1), (2, 1), (3, 1)],
    "chunk 65 + 3": [(0, 65), (1, 1), (2, 1), (3, 1)],
    "chunk 40 + 3": [(0, 40), (1, 1), (2, 1), (3, 1)],
    "chunk 63": [(0, 63)],
    "chunk 64": [(0, 64)],
}


def time_shape(
    ctx: Context, batch: Batch, runs: list[tuple[int, int]], length: int, rng, repeat: int
) -> float:
    """Median ms of one llama_decode of `runs` at position `length` of each sequence."""
    times = []
    for i in range(repeat + 1):
        batch.clear()
        for seq, rows in runs:
            batch.add(seq, rng.integers(100, 40000, rows).tolist(), length, True)
        began = time.perf_counter()
        if ctx.decode(batch) != 0:
            raise RuntimeError("llama_decode failed")
        if i:  # the first is a warm-up
            times.append((time.perf_counter() - began) * 1000)
        for seq, _ in runs:
            ctx.remove_seq(seq, length)
    return statistics.median(times)


def fill(ctx: Context, batch: Batch, num_seqs: int, length: int, rng) -> None:
    """Each sequence's KV: `length` random tokens, in chunks of n_batch (not timed)."""
    ctx.clear()
    for seq in range(num_seqs):
        prompt = rng.integers(100, 40000, length).tolist()
        for at in range(0, length, N_BATCH):
            batch.clear()
            batch.add(seq, prompt[at : at + N_BATCH], at, True)
            if ctx.decode(batch) != 0:
                raise RuntimeError("llama_decode failed")


def pair_costs(model: Model, lengths: list[int], repeat: int, rows: tuple[int, ...], *,
               tile: bool) -> None:  # fmt: skip
    """The --tail and --window tables: on 2 sequences with flash attention, R rows of one
    beside a decode row of the other in one llama_decode, against a chunk in a decode of
    its own plus the decode row alone (--tail: the 64-row tile; --window: the same R)."""
    rng = np.random.default_rng(5)
    cells = max(lengths) + N_BATCH
    ctx = Context(model, ContextParams(cells * 2, N_BATCH, 2, 2, flash_attn=True))
    batch = Batch(N_BATCH)
    shapes = {f"{r} + 1": [[(0, r), (1, 1)]] for r in rows}
    if tile:
        shapes["tile alone, then 1"] = [[(0, 64)], [(1, 1)]]
    else:
        shapes.update({f"{r} alone, then 1": [[(0, r)], [(1, 1)]] for r in rows})
    print("| KV length | " + " | ".join(shapes) + " |\n|" + "---|" * (len(shapes) + 1))
    for length in lengths:
        fill(ctx, batch, 2, length, rng)
        row = []
        for decodes in shapes.values():
            total = sum(time_shape(ctx, batch, runs, length, rng, repeat) for runs in decodes)
            row.append(f"{total:.0f}")
        print(f"| {length} | " + " | ".join(row) + " |", flush=True)
    ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="256,1024,2048")
    ap.add_argument("--fa", default="off,on")
    ap.add_argument("--unified", default="off,on", help="one KV pool for all sequences")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--shapes", default=";".join(SHAPES), help="a subset, separated by ;")
    ap.add_argument("--tail", action="store_true", help="the warm tail's padding choice")
    ap.add_argument("--window", action="store_true", help="a windowed model's chunk split")
    ap.add_argument("--model", default=None, help="a GGUF (default: the bundled model)")
    args = ap.parse_args()
    model = Model(args.model or default_model_path())
    if args.tail or args.window:
        lengths = [int(x) for x in args.lengths.split(",")]
        rows = (20, 40, 60) if args.tail else (64, 128, 256)
        pair_costs(model, lengths, args.repeat, rows, tile=args.tail)
        return
    rng = np.random.default_rng(18)
    lengths = [int(x) for x in args.lengths.split(",")]
    shapes = {name: SHAPES[name] for name in args.shapes.split(";")}
    configs = [(fa, u) for fa in args.fa.split(",") for u in args.unified.split(",")]
    print(f"model {Path(model.path).name}, {N_SEQ} sequences x {N_CTX_SEQ} cells, "
          f"n_batch {N_BATCH}, 2 threads; median ms of one llama_decode")  # fmt: skip
    header = "| KV length | shape | " + " | ".join(f"fa {fa}, unified {u}" for fa, u in configs)
    print(header + " |\n|" + "---|" * (len(configs) + 2))
    results: dict[tuple[str, str], dict[tuple[int, str], float]] = {}
    for fa, unified in configs:
        params = ContextParams(
            N_CTX_SEQ * N_SEQ, N_BATCH, N_SEQ, 2, kv_unified=unified == "on", flash_attn=fa == "on"
        )
        ctx, batch = Context(model, params), Batch(N_BATCH)
        out = results[(fa, unified)] = {}
        for length in lengths:
            fill(ctx, batch, N_SEQ, length, rng)
            for name, runs in shapes.items():
                out[(length, name)] = time_shape(ctx, batch, runs, length, rng, args.repeat)
                print(f"  fa {fa}, unified {unified}, {length}: {name} "
                      f"{out[(length, name)]:.1f} ms", file=sys.stderr, flush=True)  # fmt: skip
        ctx.close()
    for length in lengths:
        for name in shapes:
            cells = " | ".join(f"{results[c][(length, name)]:.1f}" for c in configs)
            print(f"| {length} | {name} | {cells} |")


if __name__ == "__main__":
    main()
