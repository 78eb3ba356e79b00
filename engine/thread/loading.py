"""Loading a model: `load`, which builds everything a worker owns from an `EngineConfig`
(engine/config.py).

Runs on the engine thread. A load that fails part way frees what it had made (the
model, its contexts) before it raises: an on-demand model whose load
fails is loaded again by a later request, and each failure must not keep a context's
KV buffers behind. A load whose engine is closed meanwhile (`LoadReport.load_cancelled`)
stops the same way at its next step: after the download, inside llama.cpp's model load
(its progress callback answers "stop"), before the contexts are made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cache import PrefixCache
from engine.config import NO_PROJECTOR, EngineConfig
from engine.exact_rules import CPU_ROW_BY_ROW, CPU_TILE_PAYS, GPU_KERNELS, exact_min_rows
from engine.family import ModelFamily, UnsupportedModelError
from engine.llama import (
    CaptureErrors,
    Context,
    ContextParams,
    Model,
    Vision,
    cpu_has_amx,
    projector_beside,
)
from engine.media import image_positions_limit
from engine.thread.embedder import Embedder
from engine.thread.exactness import CANDIDATES, exact_rows
from engine.thread.plan import checkpoint_tokens
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.stats import StepCounters
from engine.thread.worker import Deliver, Worker
from engine.types import ModelInfo

log = logging.getLogger(__name__)


class LoadReport(Protocol):
    """Where a load reports how far it is (the Engine: read by /health and the loader)."""

    load_progress: float  # 0..1
    load_phase: str  # "downloading" while a fetch runs, else "loading"
    loaded_bytes: int  # weights + KV, known once the model file is read
    load_cancelled: bool  # set by a close: stop and free what was made


class LoadCancelled(Exception):
    """The engine was closed while it loaded; what the load had made is freed."""


def _go_on(report: LoadReport) -> None:
    if report.load_cancelled:
        raise LoadCancelled("the engine was closed during its load")


@dataclass(frozen=True, slots=True)
class Loaded:
    worker: Worker
    info: ModelInfo
    cache: PrefixCache | None  # the one given, or the one this load made


def load(
    cfg: EngineConfig,
    report: LoadReport,
    deliver: Deliver,
    counters: StepCounters,
    open_cache: Callable[[str], PrefixCache | None],
) -> Loaded:
    """Fetch and load the model, make its contexts and a worker counting into
    `counters`. `open_cache(model_path)`: the engine's prefix cache, which outlives a
    load (it is open whether or not the model is loaded). Frees everything it made when
    it raises."""

    def progress(value: float) -> None:
        report.load_progress = value

    def model_progress(value: float) -> bool:
        progress(value)
        return not report.load_cancelled  # False: llama.cpp abandons the model load

    cfg = fetched(cfg, report)
    _go_on(report)
    with contextlib.ExitStack() as undo:  # emptied once everything is made
        model = Model(
            cfg.model_path,
            on_progress=model_progress,
            n_gpu_layers=cfg.n_gpu_layers,
            extra_bufts=cfg.use_extra_bufts,
        )
        undo.callback(model.close)  # called last: the contexts go first
        _go_on(report)
        family = model.family()
        refusal = family.refusal()
        if refusal is not None:
            raise UnsupportedModelError(f"model '{cfg.model_id}' cannot be served: {refusal}")
        total_cells = cfg.n_ctx if cfg.kv_unified else cfg.n_ctx * cfg.n_seq_max
        embed_cells = cfg.embed_n_ctx if cfg.embeddings else 0
        report.loaded_bytes = model.size_bytes() + model.kv_bytes_per_cell() * (
            total_cells + embed_cells
        )
        for adapter in cfg.loras:
            path = adapter.path
            if adapter.fetch is not None:
                report.load_phase = "downloading"
                path = adapter.fetch(progress)
                report.load_phase = "loading"
            model.load_lora(adapter.id, path)
        _load_projector(cfg, model)
        _go_on(report)
        ctx = Context(model, _context_params(cfg, total_cells))
        undo.callback(ctx.close)
        embedder = None
        if cfg.embeddings:
            embed_ctx = Context(
                model,
                ContextParams(cfg.embed_n_ctx, cfg.embed_chunk, 1, cfg.threads, embeddings=True),
            )
            undo.callback(embed_ctx.close)
            embedder = Embedder(embed_ctx, cfg.embed_chunk)
        cache = open_cache(cfg.model_path)
        if cache is not None:
            cache.whole_states = family.blob_bound
        min_rows = _exact_min_rows(cfg, ctx, family)
        scheduler = Scheduler(
            SchedulerConfig(
                cfg.n_seq_max,
                ctx.n_ctx,
                ctx.n_ctx_seq,
                cfg.n_batch,
                cfg.prefill_chunk,
                exact=cfg.exact_reuse,
                exact_min_rows=min_rows,
                # Verifying drafts drops the rejected ones' KV: a whole state cannot.
                speculative=cfg.speculative and not family.whole_state,
                whole_state=family.whole_state,
                n_swa=family.n_swa,
                flash_attn=cfg.flash_attn,
                cpu=_padding_rule(cfg),
                checkpoint_tokens=checkpoint_tokens(cache.config.block_tokens) if cache else 0,
                projector=model.vision.identity if model.vision is not None else "",
            ),
            counters,
        )
        info = _model_info(cfg, model, ctx, family, scheduler.config)
        worker = Worker(model, ctx, scheduler, embedder, deliver, cache, cfg.limits)
        undo.pop_all()
    return Loaded(worker, info, cache)


def fetched(cfg: EngineConfig, report: LoadReport) -> EngineConfig:
    """`cfg` with its hub files local: the model's GGUF and, where `fetch_mmproj` is
    set, the repository's projector (none when it has none), downloaded before the
    model loads as llama-server's -hf downloads both."""
    if cfg.fetch is None:
        return cfg

    def progress(value: float) -> None:
        report.load_progress = value

    report.load_phase = "downloading"
    cfg = dataclasses.replace(cfg, model_path=cfg.fetch(progress))
    if cfg.fetch_mmproj is not None:
        cfg = dataclasses.replace(cfg, mmproj=cfg.fetch_mmproj(progress) or NO_PROJECTOR)
    report.load_phase, report.load_progress = "loading", 0.0
    return cfg


def projector_of(cfg: EngineConfig) -> str | None:
    """The projector GGUF a load takes: `mmproj` as configured (a hub model's: fetched by
    then), none for NO_PROJECTOR, else the one mmproj*.gguf beside the model file."""
    if cfg.mmproj == NO_PROJECTOR:
        return None
    return cfg.mmproj or projector_beside(cfg.model_path)


def _load_projector(cfg: EngineConfig, model: Model) -> None:
    """The model's projector, if it has one. One that does not fit the model (another
    model's output width, an unsupported kind) refuses the load in one line naming
    llama.cpp's reason: loading again cannot help."""
    path = projector_of(cfg)
    if not path:
        return
    with CaptureErrors() as errors:  # libmtmd logs why; its init only answers NULL
        try:
            model.vision = Vision(
                path, model.handle, threads=cfg.threads, use_gpu=cfg.n_gpu_layers != 0
            )
        except RuntimeError as exc:
            reasons = [line for e in errors for line in e.splitlines() if line.strip()]
            why = f": {'; '.join(reasons)}" if reasons else ""
            raise UnsupportedModelError(
                f"model '{cfg.model_id}' cannot be served: {exc}{why}"
            ) from None
    log.info("vision projector %s loaded for '%s'", path, cfg.model_id)


def free_worker(worker: Worker) -> None:
    """Free what a load made for `worker`: its contexts, then the model."""
    worker.ctx.close()
    if worker.embedder is not None:
        worker.embedder.ctx.close()
    worker.model.close()


def _padding_rule(cfg: EngineConfig) -> str:
    """Which warm-tail padding rule the device gets (engine/thread/plan.py pad_from): measured on
    two CPUs; a GPU runs its own attention kernels."""
    if cfg.n_gpu_layers != 0:
        return GPU_KERNELS
    return CPU_TILE_PAYS if cpu_has_amx() else CPU_ROW_BY_ROW


def _context_params(cfg: EngineConfig, total_cells: int) -> ContextParams:
    return ContextParams(
        total_cells,
        cfg.n_batch,
        cfg.n_seq_max,
        cfg.threads,
        kv_unified=cfg.kv_unified,
        flash_attn=cfg.flash_attn,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        n_ubatch=cfg.n_ubatch,
    )


def _exact_min_rows(cfg: EngineConfig, ctx: Context, family: ModelFamily) -> int:
    """The rows a warm start computes again in exact mode: measured on this model when
    exact_reuse is on (engine/thread/exactness.py), else the rule for the attention kind."""
    if not cfg.exact_reuse:
        return exact_min_rows(cfg.flash_attn)
    # A purely recurrent model has no attention layer: flash attention's tile is no bound.
    attends = family.memory != "recurrent"
    rows = exact_rows(ctx, flash_attn=cfg.flash_attn and attends, whole_state=family.whole_state)
    if rows is None:
        raise UnsupportedModelError(
            f"exact_reuse: no recompute of up to {CANDIDATES[0]} prompt rows gives the cold "
            f"logits of model '{cfg.model_id}' ({family.architecture}, {family.quantization}) "
            "on this machine; set exact_reuse = false for it"
        )
    return rows


def _model_info(
    cfg: EngineConfig, model: Model, ctx: Context, family: ModelFamily, sched: SchedulerConfig
) -> ModelInfo:
    return ModelInfo(
        model_id=cfg.model_id,
        path=cfg.model_path,
        n_ctx=ctx.n_ctx_seq,
        n_ctx_train=model.n_ctx_train,
        n_vocab=model.n_vocab,
        n_embd=model.n_embd,
        n_seq_max=cfg.n_seq_max,
        chat_template=model.chat_template(),
        bos_token=model.token_text(model.bos_id) if model.bos_id >= 0 else "",
        eos_token=model.token_text(model.eos_id) if model.eos_id >= 0 else "",
        add_bos=model.add_bos,
        description=model.description(),
        size_bytes=model.size_bytes(),
        n_params=model.n_params(),
        loras=cfg.loras,
        metadata=model.metadata(),
        fim_tokens=model.fim_tokens(),
        special_tokens=model.special_tokens(),
        embed_n_ctx=cfg.embed_n_ctx if cfg.embeddings else 0,
        speculative_ok=cfg.flash_attn and not family.whole_state,
        family=family,
        exact_min_rows=sched.exact_min_rows if sched.exact else 0,
        warm_tail=sched.warm_tail,
        vision=model.vision is not None,
        media_marker=model.vision.marker if model.vision is not None else "",
        max_image_positions=image_positions_limit(
            sched.step_tokens,
            sched.num_slots,
            cfg.n_ubatch,
            sched.exact_min_rows if sched.exact else 0,
            sched.row_block,
        ),
    )
