"""What kvserve costs per generated token beyond llama.cpp's own work (issue 30 item 4).

    python bench/server_cost.py                      # c=1 and c=8, 128 tokens each
    python bench/server_cost.py --tokens 16 --skip-http   # a smoke run

Three runs of the same greedy decode (the bundled model, the engine's context settings:
8 slots, 2 threads, flash attention as configured), each timed over its steady window:

- **bare loop**: llama-cpp-python's low-level bindings and nothing else: tokenize,
  prefill, then one `llama_decode` per step with one row per sequence and a greedy
  sampler (`llama_sampler_init_greedy`) per sequence;
- **kvserve engine**: the engine in this process, its outputs read by an asyncio
  consumer, with a light probe on the engine thread: `Worker.step`, `Context.decode` and
  `Sampler.sample` timed (class-level wrappers), so that step time minus decode minus
  sampling is the engine's own cost (scheduling, the batch, detokenizing, stop checks,
  bookkeeping); what the consumer sees beyond the step is the hand-off to the event loop;
- **kvserve HTTP**: a kvserve process (bench/compare.py's `start`), streamed chat
  completions read as SSE (`ignore_eos`, so every run generates the same count).

At c=1 a figure is ms per generated token; at c=8 ms per row (a step's time over the
rows it computed, all eight sequences generating). The window starts when the last
sequence got its first token and ends when the first one finished, so prefill is out.
Run on a quiet machine: on a shared one the ratios of one run hold, the absolutes drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402
from bench.loadgen import content_of, sse_objects  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402

QUESTION = "Write a long story about a lighthouse keeper and the sea, part {i}."


@dataclass
class Arrivals:
    """When each stream's tokens arrived: (time, tokens) per stream."""

    streams: list[list[tuple[float, int]]] = field(default_factory=list)

    def span(self) -> tuple[float, float]:
        """From the last stream's first token to the first stream's last: every stream
        is generating throughout."""
        return max(s[0][0] for s in self.streams), min(s[-1][0] for s in self.streams)

    def per_row_ms(self) -> float:
        """ms per token over `span`."""
        begin, end = self.span()
        tokens = sum(n for s in self.streams for t, n in s[1:] if begin < t <= end)
        return (end - begin) * 1000 / max(1, tokens)


# -- bare loop ---------------------------------------------------------------------------


def _drop_log(_level: int, _text: bytes, _user: object) -> None:
    pass


_QUIET = None  # made on first use (llama_cpp imported lazily); kept referenced for llama.cpp


def bare_loop(model_path: str, settings: EngineSettings, conc: int, tokens: int) -> dict:
    import llama_cpp as C

    from engine.llama import cpu_has_amx

    global _QUIET
    _QUIET = _QUIET or C.llama_log_callback(_drop_log)

    # llama.cpp's default logger writes its debug lines to stderr on every decode (a
    # graph's inputs, one line each): ms a step. The engine routes them into `logging`;
    # the bare loop drops them.
    C.llama_log_set(_QUIET, None)
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = not cpu_has_amx()  # the engine's weight setting
    mp.n_gpu_layers = settings.n_gpu_layers
    model = C.llama_model_load_from_file(model_path.encode(), mp)
    vocab = C.llama_model_get_vocab(model)
    cp = C.llama_context_default_params()
    cp.n_ctx = settings.n_ctx * settings.n_seq_max
    cp.n_batch = cp.n_ubatch = settings.n_batch
    cp.n_seq_max = settings.n_seq_max
    cp.n_threads = cp.n_threads_batch = settings.threads
    cp.kv_unified = settings.kv_unified
    on, off = C.LLAMA_FLASH_ATTN_TYPE_ENABLED, C.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.flash_attn_type = on if settings.flash_attn else off
    cp.no_perf = True
    ctx = C.llama_init_from_model(model, cp)
    batch = C.llama_batch_init(settings.n_batch, 0, 1)
    samplers = [C.llama_sampler_init_greedy() for _ in range(conc)]

    def put(i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits

    prompts = []
    for s in range(conc):
        text = QUESTION.format(i=s).encode()
        buf = (C.llama_token * 256)()
        n = C.llama_tokenize(vocab, text, len(text), buf, 256, True, True)
        prompts.append(list(buf[:n]))
    last, pos = [], []
    for s, prompt in enumerate(prompts):  # prefill, one sequence a decode (not timed)
        for i, token in enumerate(prompt):
            put(i, token, i, s, i == len(prompt) - 1)
        batch.n_tokens = len(prompt)
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        last.append(C.llama_sampler_sample(samplers[s], ctx, -1))
        pos.append(len(prompt))
    decode_s = sample_s = 0.0
    began = time.perf_counter()
    for _ in range(tokens - 1):
        for s in range(conc):
            put(s, last[s], pos[s], s, True)
            pos[s] += 1
        batch.n_tokens = conc
        t0 = time.perf_counter()
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        t1 = time.perf_counter()
        last = [C.llama_sampler_sample(samplers[s], ctx, s) for s in range(conc)]
        t2 = time.perf_counter()
        decode_s, sample_s = decode_s + t1 - t0, sample_s + t2 - t1
    rows = conc * (tokens - 1)
    total = (time.perf_counter() - began) * 1000 / rows
    for smpl in samplers:
        C.llama_sampler_free(smpl)
    C.llama_batch_free(batch)
    C.llama_free(ctx)
    C.llama_model_free(model)
    return {
        "ms": round(total, 3),
        "decode_ms": round(decode_s * 1000 / rows, 3),
        "sample_ms": round(sample_s * 1000 / rows, 3),
        "loop_ms": round(total - (decode_s + sample_s) * 1000 / rows, 3),
    }


# -- the engine, in process, with a probe ------------------------------------------------


@dataclass
class Probe:
    """Each engine step's end time, its seconds in all, in llama_decode and in sampling,
    and its sampled rows: summed over the steady window afterwards."""

    steps: list[tuple[float, float, float, float, int]] = field(default_factory=list)
    delivers: list[tuple[float, float]] = field(default_factory=list)  # the hand-offs
    decode_s: float = 0.0  # of the step running now
    sample_s: float = 0.0
    rows: int = 0

    def wrap(self, owner: type, name: str, into: str) -> None:
        inner: Callable = getattr(owner, name)
        probe = self

        def timed(*a: object, **kw: object) -> object:
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                t1 = time.perf_counter()
                if into == "deliver":
                    probe.delivers.append((t1, t1 - t0))
                elif into == "step":
                    probe.steps.append((t1, t1 - t0, probe.decode_s, probe.sample_s, probe.rows))
                    probe.decode_s = probe.sample_s = 0.0
                    probe.rows = 0
                else:
                    setattr(probe, into, getattr(probe, into) + t1 - t0)
                    probe.rows += into == "sample_s"

        setattr(owner, name, timed)

    def window(self, begin: float, end: float) -> dict:
        """ms per sampled row of the steps that ended inside (begin, end]."""
        inside = [s for s in self.steps if begin < s[0] <= end]
        rows = max(1, sum(s[4] for s in inside))
        step, decode, sample = (sum(s[i] for s in inside) * 1000 / rows for i in (1, 2, 3))
        deliver = sum(d for t, d in self.delivers if begin < t <= end) * 1000 / rows
        return {
            "step_ms": round(step, 3),
            "decode_ms": round(decode, 3),
            "sample_ms": round(sample, 3),
            "outside_ms": round(step - decode - sample, 3),
            "handoff_ms": round(deliver, 3),
        }


def install_probe() -> Probe:
    from engine.llama import Context, Sampler
    from engine.loop.submission import Submitting
    from engine.thread.worker import Worker

    probe = Probe()
    # the engine thread's call_soon_threadsafe of one step's outputs (after the step)
    probe.wrap(Submitting, "_deliver", "deliver")
    probe.wrap(Worker, "step", "step")
    probe.wrap(Context, "decode", "decode_s")
    probe.wrap(Sampler, "sample", "sample_s")
    return probe


async def engine_run(
    model_path: str, settings: EngineSettings, conc: int, tokens: int, probe: Probe
) -> dict:
    from cache import CacheConfig
    from engine.engine import Engine, EngineConfig
    from engine.types import GenerateRequest, SamplingParams

    # the server's engine: its settings, a RAM-tier prefix cache (no disk)
    engine = Engine(EngineConfig.of(settings, model_path, "bench", cache=CacheConfig()))
    engine.start()
    while engine.state.value == "loading":
        await asyncio.sleep(0.02)
    if not engine.ready:
        raise RuntimeError(engine.load_error)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)

    async def one(i: int, max_tokens: int, into: list[tuple[float, int]]) -> None:
        text = f"<|im_start|>user\n{QUESTION.format(i=i)}<|im_end|>\n<|im_start|>assistant\n"
        prompt = tuple(engine.tokenize(text, add_special=False, parse_special=True))
        req = GenerateRequest(uuid.uuid4().hex, prompt, greedy, max_tokens=max_tokens)
        async for _, out in await engine.generate([req]):
            if out.token_ids:
                into.append((time.perf_counter(), len(out.token_ids)))

    try:
        await one(99, 4, [])  # warm-up
        probe.steps.clear()
        probe.delivers.clear()
        arrivals = Arrivals([[] for _ in range(conc)])
        await asyncio.gather(*(one(i, tokens, arrivals.streams[i]) for i in range(conc)))
    finally:
        engine.close()
    return {"ms": round(arrivals.per_row_ms(), 3), **probe.window(*arrivals.span())}


# -- over HTTP ---------------------------------------------------------------------------


async def http_run(base: str, model: str, conc: int, tokens: int) -> dict:
    async def one(i: int, max_tokens: int, into: list[tuple[float, int]]) -> None:
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": QUESTION.format(i=i)}]}  # fmt: skip
        chunks, completion = [], 0
        async with (
            httpx.AsyncClient(base_url=base, timeout=600) as client,
            client.stream("POST", "/chat/completions", json=body) as r,
        ):
            r.raise_for_status()
            async for data in sse_objects(r):
                if content_of(data):
                    chunks.append(time.perf_counter())
                if data.get("usage"):
                    completion = int(data["usage"]["completion_tokens"])
        # a chunk may carry more than one token (held-back bytes): spread them evenly
        share = completion / max(1, len(chunks))
        into.extend((t, share) for t in chunks)  # type: ignore[misc]

    await one(99, 4, [])  # warm-up
    arrivals = Arrivals([[] for _ in range(conc)])
    await asyncio.gather(*(one(i, tokens, arrivals.streams[i]) for i in range(conc)))
    return {"ms": round(arrivals.per_row_ms(), 3)}


def report(conc: int, bare: dict, eng: dict, http: dict | None) -> str:
    unit = "ms/token" if conc == 1 else "ms/row"
    lines = [
        f"c={conc}: bare loop {bare['ms']} {unit} (decode {bare['decode_ms']}, "
        f"sample {bare['sample_ms']}, loop {bare['loop_ms']}); kvserve engine {eng['ms']} "
        f"(step {eng['step_ms']} = decode {eng['decode_ms']} + sample {eng['sample_ms']} "
        f"+ engine's own {eng['outside_ms']}; then the hand-off {eng['handoff_ms']})"
        + (f"; kvserve HTTP {http['ms']}" if http else ""),
        f"  overhead: engine thread outside decode and sampling "
        f"{eng['outside_ms'] + eng['handoff_ms']:.3f} {unit}; "
        f"engine end to end - bare {eng['ms'] - bare['ms']:.3f}"
        + (f"; HTTP - bare {http['ms'] - bare['ms']:.3f}" if http else ""),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens", type=int, default=128, help="generated per sequence")
    p.add_argument("--rounds", type=int, default=1, help="median of this many runs each")
    p.add_argument("--skip-http", action="store_true")
    # 2 is the machine's cores: llama.cpp's threads meet at a barrier every op, so on a
    # machine already busy 2 threads can cost 5-10x what 1 does (measured 350 vs 49 ms
    # a token at a load of 8): smoke runs on a shared machine take 1
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="append the figures to this JSON-lines file")
    args = p.parse_args()
    from bench.compare import bench_model, gpu_layers_wanted

    model_path, _ = bench_model()
    settings = EngineSettings(n_threads=args.threads, n_gpu_layers=gpu_layers_wanted())
    probe = install_probe()
    proc = None
    if not args.skip_http:
        proc, base, model_id = start("kvserve", args.threads, settings.n_seq_max)
    try:
        for conc in args.concurrency:
            if conc > settings.n_seq_max:
                raise SystemExit(f"--concurrency {conc}: more than the {settings.n_seq_max} slots")
            runs: dict[str, list[dict]] = {"bare": [], "engine": [], "http": []}
            for _ in range(args.rounds):  # alternating: drift on the machine hits all three
                runs["bare"].append(bare_loop(model_path, settings, conc, args.tokens))
                runs["engine"].append(
                    asyncio.run(engine_run(model_path, settings, conc, args.tokens, probe))
                )
                if proc is not None:
                    runs["http"].append(asyncio.run(http_run(base, model_id, conc, args.tokens)))
            med = {k: median_row(v) for k, v in runs.items() if v}
            print(report(conc, med["bare"], med["engine"], med.get("http")), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"concurrency": conc, "tokens": args.tokens, **med}) + "\n")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def median_row(rows: list[dict]) -> dict:
    """Each figure's median over the rounds."""
    return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}


if __name__ == "__main__":
    main()
