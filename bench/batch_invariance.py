"""Batch invariance of llama.cpp's logits on this machine: what exact reuse may skip.

    python bench/batch_invariance.py [--lengths 512,2048,4000] [--fa on,off] [--seqs 4]

Exact reuse (docs/cache.md "Reuse, and exact reuse") promises that a warm start gives the cold
greedy output. That holds only for KV positions and logits that do not depend on how
many rows the step computing them held. This script measures that dependence on the
bundled model with the engine's own context settings (a KV stream per sequence,
n_seq_max 4, 4096 cells a sequence, weights repacked as the server does by default,
2 threads; n_batch 4096 so that a whole prompt fits one llama_decode), with flash
attention on and off, on random prompts (fixed seed: the output is deterministic):

(a)/(b) the prompt in one llama_decode, then its last k positions dropped and computed
    again as a k-row step (what a warm start does): max |dlogit| of the last position
    against (a), for each k. "256-chunks": the prompt prefilled cold in the engine's
    prefill_chunk-sized steps instead.
(c) decoded tokens: after the prompt, 32 greedy tokens one row per step (each step
    holding one row of each of `seqs` sequences), against the prompt plus those 32
    tokens prefilled cold: the next-token logits (decode), the same after dropping the
    last k decoded positions and computing them again as a k-row step (reuse+k: what
    reusing decoded positions would do), and 32 more greedy tokens from both states (one
    row per step): equal tokens, and max |dlogit| while they agree. To keep the run
    short the sequences' prompts share a head whose KV is (a)'s, and "cold" computes
    each prompt's last 64 tokens plus the 32 decoded ones in one step: (b)'s k=64 and
    256-chunks columns show that this equals a whole cold prefill.

Run by hand; correctness figures only (timing on a shared CPU means nothing here).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.llama import Batch, Context, ContextParams, Model  # noqa: E402
from server.config.tree import default_model_path  # noqa: E402

SPLIT_ROWS = (1, 2, 4, 16, 63, 64)
REUSE_ROWS = (1, 2, 16, 32)
TAIL = 64  # tokens of a (c) prompt not shared with the others
DECODED = 32
PREFILL_CHUNK = 256  # the engine's default prefill_chunk
N_CTX_SEQ = 4096  # the server's default n_ctx (cells of one sequence)
N_SEQ = 4


class Bench:
    def __init__(self, model: Model, flash_attn: bool):
        params = ContextParams(
            N_CTX_SEQ * N_SEQ, N_CTX_SEQ, N_SEQ, 2, kv_unified=False, flash_attn=flash_attn
        )
        self.ctx = Context(model, params)
        self.batch = Batch(N_CTX_SEQ)
        self.vocab = model.n_vocab

    def step(self, runs: list[tuple[int, list[int], int]]) -> list[np.ndarray]:
        """One llama_decode of `(seq, tokens, start)` runs; the last row's logits of each."""
        self.batch.clear()
        rows = [self.batch.add(seq, tokens, start, True) for seq, tokens, start in runs]
        code = self.ctx.decode(self.batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        return [self.ctx.logits_row(r).copy() for r in rows]

    def prefill(self, seq: int, tokens: list[int], start: int = 0, chunk: int = 0) -> np.ndarray:
        """Tokens at positions start.. in steps of `chunk` rows (0: one step); last logits."""
        size = chunk or len(tokens)
        logits = np.empty(0)
        for i in range(0, len(tokens), size):
            (logits,) = self.step([(seq, tokens[i : i + size], start + i)])
        return logits

    def greedy(self, seqs: list[int], logits: list[np.ndarray], starts: list[int], n: int):
        """n greedy tokens of each sequence, one row of each per step: (tokens, logits) per
        step, the logits being those the next token is taken from."""
        tokens: list[list[int]] = [[] for _ in seqs]
        trail: list[list[np.ndarray]] = [[] for _ in seqs]
        for j in range(n):
            picks = [int(np.argmax(lg)) for lg in logits]
            for i, t in enumerate(picks):
                tokens[i].append(t)
            logits = self.step([(s, [picks[i]], starts[i] + j) for i, s in enumerate(seqs)])
            for i, lg in enumerate(logits):
                trail[i].append(lg)
        return tokens, trail

    def close(self) -> None:
        self.ctx.close()


def diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)))


def split_row(bench: Bench, prompt: list[int]) -> tuple[list[float], bytes]:
    """(a)/(b): one-step prefill vs the last k positions computed again; then 256-chunks.
    Also returns the one-step prompt's KV state, for (c)."""
    ctx = bench.ctx
    ctx.clear()
    whole = bench.prefill(0, prompt)
    state = ctx.get_seq_state(0)
    n = len(prompt)
    out = []
    for k in SPLIT_ROWS:
        ctx.remove_seq(0, n - k)
        out.append(diff(whole, bench.prefill(0, prompt[n - k :], n - k)))
    out.append(diff(whole, bench.prefill(1, prompt, 0, PREFILL_CHUNK)))
    return out, state


@dataclass
class Decoded:
    decode: float  # next-token logits after DECODED one-row steps vs cold prefill
    reuse: list[float]  # the same with the last k decoded positions computed again
    equal: int  # continuation tokens equal (of DECODED, worst sequence)
    cont: float  # max |dlogit| over the continuation while the tokens agree


def decoded_row(bench: Bench, state: bytes, prompts: list[list[int]]) -> Decoded:
    """(c) for len(prompts) sequences decoding together. `state`: the KV of prompts[0]
    from one step; the prompts differ in their last TAIL tokens only (agents sharing a
    head), computed as a TAIL-row step, which (b) shows gives one step's KV."""
    ctx, seqs = bench.ctx, list(range(len(prompts)))
    n = len(prompts[0])

    def load(extra: list[list[int]]) -> list[np.ndarray]:
        """Each sequence: the shared head's KV, then its tail and `extra` in one step."""
        ctx.clear()
        out = []
        for s in seqs:
            ctx.set_seq_state(s, state)
            ctx.remove_seq(s, n - TAIL)
            out.append(bench.prefill(s, prompts[s][n - TAIL :] + extra[s], n - TAIL))
        return out

    first = load([[] for _ in seqs])
    made, trail = bench.greedy(seqs, first, [n] * len(seqs), DECODED)
    end = n + DECODED
    warm_next = [t[-1] for t in trail]
    cont_w, trail_w = bench.greedy(seqs, warm_next, [end] * len(seqs), DECODED)
    reuse: dict[int, list[np.ndarray]] = {}
    for k in REUSE_ROWS:  # each sequence alone in its step, as the runner computes a chunk
        reuse[k] = []
        for s in seqs:
            ctx.remove_seq(s, end - k)
            reuse[k].append(bench.prefill(s, (prompts[s] + made[s])[-k:], end - k))
    cold_next = load(made)  # cold: the prompt and the decoded tokens prefilled together
    cont_c, trail_c = bench.greedy(seqs, cold_next, [end] * len(seqs), DECODED)
    equal, cont = DECODED, 0.0
    for s in seqs:
        agree = next((j for j in range(DECODED) if cont_w[s][j] != cont_c[s][j]), DECODED)
        equal = min(equal, agree)
        # Step j's logits come from feeding token j: comparable while tokens 0..j agree.
        for j in range(agree):
            cont = max(cont, diff(trail_w[s][j], trail_c[s][j]))
    return Decoded(
        max(diff(w, c) for w, c in zip(warm_next, cold_next, strict=True)),
        [max(diff(r, c) for r, c in zip(reuse[k], cold_next, strict=True)) for k in REUSE_ROWS],
        equal,
        cont,
    )


def fmt(x: float) -> str:
    return "0" if x == 0.0 else f"{x:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="512,2048,4000")
    ap.add_argument("--fa", default="off,on", help="flash attention settings to measure")
    ap.add_argument("--seqs", default="1,4", help="sequences decoding together in (c)")
    ap.add_argument("--seed", type=int, default=18)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    seq_counts = [int(x) for x in args.seqs.split(",")]
    model = Model(default_model_path())
    rng = np.random.default_rng(args.seed)

    def tokens(n: int) -> list[int]:
        return rng.integers(100, model.n_vocab, n).tolist()  # type: ignore[no-any-return]

    # One head per length; each sequence's prompt ends in its own TAIL tokens.
    prompts = {}
    for n in lengths:
        head = [model.bos_id, *tokens(n - 1 - TAIL)]
        prompts[n] = [head + tokens(TAIL) for _ in range(max(seq_counts))]
    print(f"model {Path(model.path).name}, {model.description()}, 2 threads, "
          f"{N_SEQ} KV streams of {N_CTX_SEQ} cells")  # fmt: skip
    split_head = " ".join(f"{'k=' + str(k):>7}" for k in SPLIT_ROWS)
    reuse_head = " ".join(f"{'reuse+' + str(k):>9}" for k in REUSE_ROWS)
    for fa in args.fa.split(","):
        bench = Bench(model, flash_attn=fa == "on")
        print(f"\nflash_attn {fa}: (a/b) last-position max|dlogit|, last chunk of k rows "
              "vs the whole prompt in one step")  # fmt: skip
        print(f"{'tokens':>6} {split_head} {'256-chunks':>10}")
        states = {}
        for n in lengths:
            row, states[n] = split_row(bench, prompts[n][0])
            print(f"{n:>6} " + " ".join(f"{fmt(x):>7}" for x in row[:-1]) + f" {fmt(row[-1]):>10}")
        print(f"flash_attn {fa}: (c) {DECODED} tokens decoded one row per step vs prefilled cold")
        print(f"{'tokens':>6} {'seqs':>4} {'decode':>7} {reuse_head} {'cont equal':>10} "
              f"{'cont |d|':>8}")  # fmt: skip
        for n in lengths:
            for count in seq_counts:
                d = decoded_row(bench, states[n], prompts[n][:count])
                reuse = " ".join(f"{fmt(x):>9}" for x in d.reuse)
                print(f"{n:>6} {count:>4} {fmt(d.decode):>7} {reuse} "
                      f"{f'{d.equal}/{DECODED}':>10} {fmt(d.cont):>8}")  # fmt: skip
            sys.stdout.flush()
        bench.close()
    model.close()


if __name__ == "__main__":
    main()
