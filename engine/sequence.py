"""`Sequence`: the one piece of state the scheduler, runner and worker share."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from engine.detokenizer import IncrementalDetokenizer
from engine.lane import Lane
from engine.types import GenerateRequest, SeqOutput, StoreCall, Timings, TokenLogprob

if TYPE_CHECKING:
    from cache import CacheHit
    from engine.llama import Sampler
    from engine.speculation import Drafter
    from engine.thinking import ThinkingBudget


def pin_key(tenant: str, session_id: str) -> str:
    """The engine thread's name for a session: ids are per tenant (two keys may each
    have a session "main"), and a session id never contains "/"."""
    return f"{tenant}/{session_id}"


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued, no slot
    RUNNING = "running"  # holds a slot: prefilling or decoding
    FINISHED = "finished"


class Sequence:
    """A prompt plus the tokens generated so far, and where it stands in the KV cache.

    `tokens` is prompt + output. The first `num_computed` of them are in the KV cache of
    slot `slot`; the rest are pending. A decoding sequence has exactly one pending token
    (the one it sampled last). Preemption only resets `num_computed` to 0: the whole
    token list is prefilled again later and generation carries on where it stopped.
    """

    __slots__ = (
        "request",
        "sampler",
        "detokenizer",
        "sink",
        "tokens",
        "num_prompt_tokens",
        "num_computed",
        "num_cached",
        "slot",
        "status",
        "prompt_logprobs",
        "num_scored",
        "checkpoints",
        "kv_floor",
        "leader",
        "cache_hit",
        "cache_seen",
        "hit_kind",
        "hit_source",
        "cold_reason",
        "num_saved",
        "arrival",
        "t_scheduled",
        "announced",
        "t_prompt_done",
        "t_first_token",
        "t_last_token",
        "t_admitted",
        "t_lookup",
        "lookup_tier",
        "lookup_tokens",
        "lookup_calls",
        "t_restore",
        "t_finished",
        "drafter",
        "num_overtaken",
        "thinking",
        "holding",
        "held",
        "t_released",
        "lane",
        "passed",
        "num_unwritten",
    )

    def __init__(
        self,
        request: GenerateRequest,
        sampler: Sampler | None,
        detokenizer: IncrementalDetokenizer,
        sink: object,
        thinking: ThinkingBudget | None = None,
    ):
        self.request = request
        self.sampler = sampler
        self.detokenizer = detokenizer
        self.sink = sink  # opaque to the engine: handed back with every output
        self.tokens: list[int] = list(request.prompt_tokens)
        self.num_prompt_tokens = len(self.tokens)
        self.num_computed = 0
        self.num_cached = 0  # prompt tokens restored instead of prefilled
        self.slot: int | None = None
        self.status = SeqStatus.WAITING
        self.prompt_logprobs: list[TokenLogprob] = []  # scored, not yet sent
        self.num_scored = 0  # prompt positions scored so far (they predict tokens 1..)
        # n > 1: the other choices wait for the first to prefill the shared prompt, then
        # copy its KV instead of computing it again.
        self.leader: Sequence | None = None
        self.cache_hit: CacheHit | None = None  # looked up before submission, if any
        # The cache's `stored` count its last lookup saw; -1: none made (and none again:
        # engine/thread/relookup.py).
        self.cache_seen = -1
        self.hit_kind = "cold"  # how the prompt was found: cold, partial, exact, session
        self.hit_source = "none"  # where reused tokens came from: none, slot, ram, disk
        self.cold_reason = ""  # why a stored prefix was found but not used (placement.py)
        self.num_saved = 0  # prompt tokens already handed to the prefix cache
        # Whole-state memories and windows: prompt positions to stop a chunk at and save
        # the state there, ascending (engine/thread/placement.py `_checkpoints`).
        self.checkpoints: list[int] = []
        # The shortest prefix its slot's KV may be cut back to (slots.window_floor): above
        # 0 once a sliding-window model's state came through a blob; 0: any.
        self.kv_floor = 0
        # Stage stamps (time.monotonic()) for queue-wait and prefill metrics; set once.
        self.arrival = time.monotonic()
        self.t_scheduled: float | None = None
        self.announced = False  # the output that tells how much of the prompt was found
        self.t_prompt_done: float | None = None
        self.t_first_token: float | None = None
        self.t_last_token: float | None = None  # for the between-tokens time limit
        # For traces (see Timings): the cache lookup made before submission, the slot
        # given, the restore of the found state, the end.
        self.t_admitted: float | None = None
        self.t_lookup: tuple[float, float] | None = None
        self.lookup_tier = ""
        self.lookup_tokens = 0
        self.lookup_calls: tuple[StoreCall, ...] = ()
        self.t_restore: tuple[float, float] | None = None
        self.t_finished: float | None = None
        self.drafter: Drafter | None = None  # speculative decoding, made at first decode
        self.num_overtaken = 0  # later arrivals admitted before it (engine/thread/admission.py)
        self.thinking = thinking  # its thinking budget (engine/thinking.py), if it has one
        # Its reader wants the whole reply: outputs are merged, not each handed over
        # (engine/thread/holding.py); what is held, and when an output last went out.
        self.holding = False
        self.held: SeqOutput | None = None
        self.t_released: float | None = None
        # Its stream's lane, if it has one (engine/thread/lanes.py), and what the lane
        # wrote that the reader has not been told of yet.
        self.lane: Lane | None = None
        self.passed: list[SeqOutput] = []
        self.num_unwritten = 0  # outputs handed to its reader that no lane wrote

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_pending(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def num_pending_prompt(self) -> int:
        return max(0, self.num_prompt_tokens - self.num_computed)

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def session_id(self) -> str | None:
        """The session's key on the engine thread (ids are per tenant)."""
        session_id = self.request.session_id
        return None if session_id is None else pin_key(self.request.tenant, session_id)

    @property
    def salt(self) -> str:
        return self.request.prefix_salt  # the cache salt and the LoRA set

    @property
    def lora(self) -> tuple[tuple[str, float], ...]:
        return self.request.lora

    @property
    def checkpoint(self) -> int:
        """The next position to save the state at on the way (`checkpoints`); 0: none."""
        return self.checkpoints[0] if self.checkpoints else 0

    @property
    def prompt_done(self) -> bool:
        return self.num_computed >= self.num_prompt_tokens

    @property
    def is_decoding(self) -> bool:
        """Prompt done: the only pending token is the last one sampled."""
        return self.num_output_tokens > 0 and self.num_pending == 1

    @property
    def close_due(self) -> tuple[int, ...]:
        """The thinking block's close, when its budget is spent and is to be forced now."""
        if self.thinking is None:
            return ()
        return self.thinking.due(whole_character=not self.detokenizer.holding)

    def timings(self) -> Timings:
        return Timings(
            self.arrival,
            self.t_scheduled,
            self.t_prompt_done,
            self.t_first_token,
            admitted=self.t_admitted,
            lookup=self.t_lookup,
            lookup_tier=self.lookup_tier,
            lookup_tokens=self.lookup_tokens,
            lookup_calls=self.lookup_calls,
            restore=self.t_restore,
            reuse_source=self.hit_source,
            cold_reason=self.cold_reason,
            finished=self.t_finished,
        )

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, slot={self.slot}, "
            f"computed={self.num_computed}/{len(self.tokens)})"
        )
