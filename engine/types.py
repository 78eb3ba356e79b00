"""Plain values that cross the boundary between the server and the engine thread.

Everything here is a frozen dataclass: a request is built on the event loop, read on the
engine thread, and never mutated by either side afterwards.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from cache import CacheStats  # re-exported: server/ reports them and may not import cache/
from cache import StoreCall as StoreCall
from cache import TierStats as TierStats
from engine.error_codes import ENGINE_RESTARTED as ENGINE_RESTARTED  # moved there
from engine.error_codes import TIME_LIMIT_CODES as TIME_LIMIT_CODES
from engine.error_codes import coded_error as coded_error
from engine.error_codes import error_code as error_code
from engine.family import ModelFamily as ModelFamily  # re-exported for the server
from engine.media import Media as Media  # re-exported: the server builds them
from engine.special_tokens import SpecialTokens as SpecialTokens  # re-exported too
from engine.thinking import ThinkingSpec


class EngineState(enum.StrEnum):
    """Where the engine stands; the server answers 503 unless READY."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    RECOVERING = "recovering"  # the engine thread died and is being rebuilt (503)
    STOPPED = "stopped"
    UNLOADED = "unloaded"  # model and context freed; the prefix cache and sessions kept


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOG token or a stop string
    LENGTH = "length"  # max_tokens or the context ran out
    ABORT = "abort"  # the client went away or asked to cancel
    ERROR = "error"  # the engine failed this sequence (see SeqOutput.error)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a request asks of the sampler chain. Defaults match llama-server's."""

    temperature: float = 1.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    min_keep: int = 1
    seed: int | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # penalty window in tokens; 0: off; -1: the whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # DRY window in tokens; 0: off; -1: the whole context
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    ignore_eos: bool = False
    grammar: str | None = None
    # Lazy grammar: sampling is free until the output so far matches one of the
    # patterns (whole-output regex; its first group marks where the grammar starts) or
    # one of the tokens is sampled; from there on the grammar constrains.
    grammar_lazy: bool = False
    grammar_trigger_patterns: tuple[str, ...] = ()
    grammar_trigger_tokens: tuple[int, ...] = ()
    # Words that trigger it, tokenized by the engine against its vocabulary: a word that
    # is one (special) token triggers on that token, any other on its text.
    grammar_trigger_words: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 and self.mirostat == 0


class SessionPool(enum.StrEnum):
    """Which bounds a session counts against (engine/loop/sessions.py): the sessions clients
    name, or those kept for stored Responses-API conversations. Each pool has the same
    bounds and retires its own idle sessions, so neither can use up or evict the other."""

    NAMED = "named"  # session_id, X-Kvserve-Session, POST /v1/sessions
    CHAIN = "chain"  # minted by the Responses API for a stored response chain


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One sequence to generate. `n > 1` in the API becomes n of these."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until EOG or the context is full; 0: score only
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: off; k >= 0: sampled token plus top k
    prompt_logprobs: int | None = None  # None: off; k >= 0: each prompt token's, plus top k
    # Sticky session: the slot stays pinned to this id after the request (see sessions.py).
    session_id: str | None = None
    session_pool: SessionPool = SessionPool.NAMED  # the pool a new session is created in
    # Who sent it (an opaque digest of the API key, "" without auth): sessions belong to it.
    tenant: str = ""
    # Prefixes are shared only between requests with the same salt (slots and the cache).
    cache_salt: str = ""
    # LoRA adapters applied, as (adapter id, scale) sorted by id, no zero scales: the
    # effective set (see lora_set in server/serving/engine_requests.py). Part of the prefix
    # namespace (`prefix_salt`).
    lora: tuple[tuple[str, float], ...] = ()
    # Speculative decoding by prompt lookup; None: the model's default.
    speculative: bool | None = None
    thinking: ThinkingSpec | None = None  # its thinking block and budget (engine/thinking.py)
    media: tuple[Media, ...] = ()  # the images prompt_tokens holds (ids < 0), in order

    @property
    def prefix_salt(self) -> str:
        """The salt prefixes are stored and found under: KV computed with one adapter set
        is never reused under another (nor under none)."""
        if not self.lora:
            return self.cache_salt
        return self.cache_salt + LORA_SALT_MARK + ",".join(f"{i}={s!r}" for i, s in self.lora)


# Separates a request's cache_salt from its adapter set in `prefix_salt`.
LORA_SALT_MARK = "\x00lora:"


def salt_of_prefix(prefix_salt: str) -> str:
    """The cache_salt a `prefix_salt` was made from, its adapter set left out: whose a
    stored prefix is (a tenant's view and purge of the cache) is decided on this part."""
    return prefix_salt.partition(LORA_SALT_MARK)[0]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter a model is served with: `scale` applies to requests that name none."""

    id: str
    path: str
    scale: float = 1.0
    # Called on the engine thread before the adapter loads, when set: fetches it (from a
    # hub) and returns its local path, used instead of `path`.
    fetch: Callable[[Callable[[float], None]], str] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Timings:
    """When a sequence passed each stage, in `time.monotonic()` seconds (None: not reached).

    arrival: submitted to the engine; scheduled: first in a step; prompt_done: its whole
    prompt in the KV cache; first_token: its first token sampled. The rest are for traces
    (server/telemetry/spans.py): admitted: given a slot; lookup: (start, end) of the
    prefix-cache lookup, which runs before arrival, and what it found (lookup_tier: ram,
    disk or shared, "" for none; lookup_tokens: prompt tokens matched; lookup_calls: the
    calls it made to the shared store); restore: (start, end) of loading that state into
    the slot; reuse_source: where the reused prompt tokens came from (none, slot, ram,
    disk, shared); finished: the sequence ended."""

    arrival: float
    scheduled: float | None = None
    prompt_done: float | None = None
    first_token: float | None = None
    admitted: float | None = None
    lookup: tuple[float, float] | None = None
    lookup_tier: str = ""
    lookup_tokens: int = 0
    lookup_calls: tuple[StoreCall, ...] = ()
    restore: tuple[float, float] | None = None
    reuse_source: str = "none"
    finished: float | None = None
    # Why a prompt that found a stored prefix computed cold ("": it did not, or found
    # none): exact_tail, longer_state, window, short, kv_op_failed (engine/thread/placement.py).
    cold_reason: str = ""

    @property
    def queue_wait(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def prefill(self) -> float | None:
        if self.scheduled is None or self.prompt_done is None:
            return None
        return self.prompt_done - self.scheduled


@dataclass(frozen=True, slots=True)
class SeqOutput:
    """An increment of one sequence: new text, the tokens behind it, maybe the end.

    `text` may lag `token_ids`: bytes of an incomplete UTF-8 character or a possible
    stop-string prefix are held back until they resolve.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    # Log-probabilities of prompt tokens 1..n-1 (the first has no context), sent once:
    # with the first output after the prompt is in.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    # Set on the final output only:
    num_reasoning_tokens: int = 0  # output tokens inside thinking blocks, tags included
    hit_kind: str = ""  # how the prompt was found: cold, partial, exact or session
    stop_sequence: str = ""  # the stop string that ended a STOP finish ("": an EOG token)
    num_kv_tokens: int = 0  # tokens whose KV the slot keeps after the request
    timings: Timings | None = None  # with the finish only
    written: bool = False  # its stream's lane sent its text already (engine/lane.py)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Facts about the loaded model that the server needs."""

    model_id: str
    path: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_seq_max: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool
    description: str = ""
    size_bytes: int = 0
    n_params: int = 0
    loras: tuple[LoraAdapter, ...] = ()
    # The GGUF's metadata (tokenizer.* arrays left out), for descriptions such as
    # Ollama's /api/show; the fill-in-the-middle tokens (prefix, suffix, middle) when
    # the vocabulary has all three; the longest input /v1/embeddings takes (0: none).
    metadata: tuple[tuple[str, str], ...] = ()
    fim_tokens: tuple[int, int, int] | None = None
    embed_n_ctx: int = 0
    special_tokens: SpecialTokens = SpecialTokens()  # the vocabulary's (engine/special_tokens.py)
    # Speculative decoding gives plain decoding's tokens only with flash attention (a
    # verified chunk of 2+ rows runs other kernels than a one-row decode without it).
    speculative_ok: bool = True
    family: ModelFamily | None = None  # the load's probe (engine/family.py)
    exact_min_rows: int = 0  # exact_reuse: prompt rows computed again, measured; 0: off
    warm_tail: tuple[int, str] = (1, "")  # prompt rows a warm start computes again, and why
    vision: bool = False  # a projector is loaded: prompts may carry images
    media_marker: str = ""  # marks an image's place in the prompt text ("<__media__>")
    # The most positions one image may take: decoded whole in one step (engine/media.py
    # image_positions_limit); 0: no bound.
    max_image_positions: int = 0


@dataclass(frozen=True, slots=True)
class TenantCacheView:
    """One tenant's share of the prefix cache and its own requests' cache use."""

    entries: int  # stored prefixes under its salts
    tokens: int  # tokens those prefixes cover
    requests: tuple[tuple[str, int], ...]  # (hit kind, count) of its finished requests
    reused_tokens: int  # prompt tokens its requests did not prefill


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the status page shows it (a racy snapshot, for reporting)."""

    index: int
    busy: bool  # a sequence runs in it
    session: str | None  # the session (`Session.key`: tenant/id) it holds or is pinned to
    tokens: int  # tokens whose KV it holds (computed so far, or resident when idle)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine for /metrics and tests."""

    num_slots: int
    num_running: int
    # the rest start at 0 (an engine that has not run yet)
    num_waiting: int = 0
    kv_cells_used: int = 0
    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_decode_failures: int = 0
    last_batch_size: int = 0
    num_sessions_pinned: int = 0
    num_reclaims: int = 0  # idle sessions' slots taken for other requests
    num_restore_failures: int = 0
    num_reused_tokens: int = 0  # prompt tokens not prefilled thanks to a slot or the cache
    num_drafted_tokens: int = 0  # speculative decoding: draft tokens verified
    num_accepted_tokens: int = 0  # draft tokens the sampler agreed with (kept)
    hits: tuple[tuple[str, int], ...] = ()  # requests by kind: cold/partial/exact/session
    hit_sources: tuple[tuple[str, int], ...] = ()  # requests by source: none/slot/ram/disk
    # Requests that found a stored prefix but computed cold, by why (Timings.cold_reason).
    cold_reasons: tuple[tuple[str, int], ...] = ()
    cache: CacheStats | None = None
    # Tokens per step as a histogram: counts[i] steps had at most bounds[i] tokens (and
    # more than bounds[i-1]); counts has one more entry, for steps above the last bound.
    batch_size_bounds: tuple[int, ...] = ()
    batch_size_counts: tuple[int, ...] = ()
    batch_size_sum: int = 0
    num_decode_aborts: int = 0  # decodes interrupted past their time budget
    num_timeouts: int = 0  # sequences ended by a per-request time limit
    num_rebuilds: int = 0  # times the engine thread died and was rebuilt in place
    num_refused_drops: int = 0  # cuts llama.cpp refused (recurrent memory): computed cold
    num_checkpoints: int = 0  # whole-state memories: states saved where prompts diverged
    num_lane_writes: int = 0  # streamed outputs the engine thread wrote (a stream's lane)
    slots: tuple[SlotView, ...] = ()  # per slot: busy, session, tokens held


class EngineError(Exception):
    """Base class of errors the engine reports to callers."""


class InvalidRequestError(EngineError):
    """The request cannot be served as asked (bad grammar, bad token id, too long)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class QueueFullError(EngineError):
    """Every slot is busy and the admission queue is at its bound."""

    def __init__(self, retry_after_s: int = 1):
        super().__init__("the server is at capacity; retry later")
        self.retry_after_s = retry_after_s


class EngineNotReadyError(EngineError):
    """The model is still loading (or failed to load)."""


class EngineRecoveringError(EngineNotReadyError):
    """The engine thread died and its context is being rebuilt (a moment)."""


class SessionNotFoundError(EngineError):
    """No such session for this tenant (another tenant's sessions are not found either)."""

    def __init__(self, session_id: str):
        super().__init__(f"no session '{session_id}'")
        self.session_id = session_id


class SessionBusyError(EngineError):
    """The session already has a request in flight (or already exists, on create)."""


class NoSlotError(EngineError):
    """Every slot is busy with a request in flight: nothing can be forked into."""


@dataclass(frozen=True, slots=True)
class TimeLimits:
    """Per-request time limits in seconds (0: none). prefill: from arrival to the first
    token; token: between two tokens; total: arrival to the end; decode: one
    llama_decode (interrupted through llama.cpp's abort callback past it)."""

    prefill_s: float = 600.0
    token_s: float = 120.0
    total_s: float = 3600.0
    decode_s: float = 120.0


class GenerationError(EngineError):
    """The engine failed a sequence mid-way (a failed llama_decode, say)."""
