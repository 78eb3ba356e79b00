"""A fake engine with the server-facing interface of `engine.engine.Engine`.

Tokens are UTF-8 bytes (token id = byte value), so prompts and replies are easy to
reason about. Each sequence "generates" `reply` one byte per tick, through the real
`IncrementalDetokenizer` (stop strings, UTF-8 hold-back) and the real `Generation`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chat.template import CHATML
from engine.config import SessionLimits
from engine.detokenizer import IncrementalDetokenizer
from engine.engine import EngineState, Generation
from engine.loop.sessions import Session, SessionRegistry, unpinned_if_busy
from engine.loop.validation import check_context, check_logit_bias
from engine.media import media_ids
from engine.thinking import UNLIMITED, ThinkingBudget
from engine.types import (
    CacheStats,
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    Media,
    ModelFamily,
    ModelInfo,
    NoSlotError,
    QueueFullError,
    SeqOutput,
    SessionBusyError,
    SlotView,
    SpecialTokens,
    TenantCacheView,
    Timings,
    TokenLogprob,
    TopLogprob,
)

PIECES = [bytes([i]) for i in range(256)] + [b""] * 4
EOS = 256
BOS = 257  # in the vocabulary, not added (add_bos is False)
# The special tokens' text (llama.cpp's unparse_special), as /tokenize's pieces show it.
SPECIAL_TEXT = {EOS: b"<|im_end|>", BOS: b"<s>"}
FAKE_IMAGE_TOKENS = 4  # positions each image takes in a fake prompt
# The leading bytes of the image files the fake "decodes": PNG, JPEG, GIF, BMP, as the engine.
IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM")


class FakeEngine:
    def __init__(
        self,
        *,
        reply: str = "Hello from the fake engine.",
        delay: float = 0.0,
        n_ctx: int = 512,
        n_seq_max: int = 4,
        max_queue: int = 4,
        ready: bool = True,
        model_id: str = "fake-model",
        sessions: SessionLimits | None = None,
        vision: bool = False,  # a projector "loaded": tokenize_media takes images
    ):
        self.reply = reply.encode()
        self.delay = delay
        self.prefill_delay = 0.0  # seconds before the first token, as a long prompt's prefill
        self.context_ends = False  # end a reply where the context does (engine's out_of_room)
        self.state = EngineState.READY if ready else EngineState.LOADING
        self.load_progress = 1.0 if ready else 0.25
        self.load_error: str | None = None
        self.load_refused = False
        self.load_phase = "loading"
        self.load_seconds = 0.0
        self.memory_bytes = 0
        self.fail_next = False
        self.replies: list[str] = []  # when set, each request takes the next one (then `reply`)
        self.fail_error = "llama_decode failed with code -3 (fake)"  # what the failure says
        self.cached = 0  # reported as num_cached_tokens with every finish
        self.capacity = n_seq_max + max_queue
        self.outstanding = 0
        self.submitted: list[GenerateRequest] = []
        self.stored: list[GenerateRequest] = []  # "cache entries", one per request
        self.aborted: list[str] = []
        self.held: list[str] = []  # request ids whose reader asked for held outputs
        self.running: set[str] = set()
        self._info = ModelInfo(
            model_id=model_id,
            path="/nonexistent/fake.gguf",
            n_ctx=n_ctx,
            n_ctx_train=n_ctx,
            n_vocab=len(PIECES),
            n_embd=8,
            n_seq_max=n_seq_max,
            chat_template=CHATML,
            bos_token="",
            eos_token="<|im_end|>",
            add_bos=False,
            special_tokens=SpecialTokens(bos=BOS, eos=EOS, eot=EOS, nl=10),
            vision=vision,
            media_marker="<__media__>" if vision else "",
            family=ModelFamily("llama", n_ctx_train=n_ctx, n_params=1000, n_layer=2, n_embd=8,
                               size_bytes=4096, quantization="F32"),  # fmt: skip
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self.sessions = SessionRegistry(sessions or SessionLimits())
        self.pinned: set[str] = set()  # sessions (keys) whose "slot" is resident
        self.session_of: dict[str, Session] = {}  # request id -> the session it began on
        self.fork_error: str | None = None  # set to make the next fork find no slot

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    @property
    def info(self) -> ModelInfo:
        return self._info

    def start(self) -> None:
        # an unloaded fake loads at once, as a real engine would after its load time
        # (one made with ready=False stays loading: tests that drive the state by hand)
        if self.state is EngineState.UNLOADED:
            self.state, self.load_progress = EngineState.READY, 1.0

    @property
    def busy(self) -> bool:
        return self.outstanding > 0

    def unload(self) -> bool:
        self.state = EngineState.UNLOADED
        return True

    def wait_stopped(self, timeout: float = 0) -> bool:
        return True

    def close(self, timeout: float = 0) -> None:
        for task in self._tasks:
            task.cancel()

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return list(text.encode())

    def tokenize_media(self, text: str, media: Sequence[Media], *, add_special: bool) -> list[int]:
        """As the engine's: text as tokenize(), each image 4 ids < 0 from its digest;
        param "image" without vision or when the markers and images differ in number,
        "image N" for an image whose bytes are not a PNG, JPEG, GIF or BMP."""
        marker = self._info.media_marker
        if not self._info.vision or not marker:
            raise InvalidRequestError(f"'{self._info.model_id}' takes no images", param="image")
        parts = text.split(marker)
        if len(parts) != len(media) + 1:
            raise InvalidRequestError(
                f"the prompt marks {len(parts) - 1} images and carries {len(media)}",
                param="image",
            )
        tokens = self.tokenize(parts[0], add_special=add_special)
        for index, (image, part) in enumerate(zip(media, parts[1:], strict=True)):
            if not image.data.startswith(IMAGE_MAGIC):
                message = f"image {index} cannot be decoded"
                raise InvalidRequestError(message, param=f"image {index}")
            tokens += media_ids(image.digest, FAKE_IMAGE_TOKENS)
            tokens += self.tokenize(part, add_special=False)
        return tokens

    def detokenize(
        self, tokens: Sequence[int], *, remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        tokens = list(tokens)
        if remove_special and self._info.add_bos and tokens[:1] == [BOS]:  # llama.cpp's rule
            tokens = tokens[1:]
        pieces = (self.special_piece(t) if unparse_special else PIECES[t] for t in tokens)
        return b"".join(pieces).decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        return PIECES[token]

    def special_piece(self, token: int) -> bytes:
        return SPECIAL_TEXT.get(token, PIECES[token])

    def stats(self) -> EngineStats:
        return EngineStats(
            num_slots=self._info.n_seq_max,
            num_running=len(self.running),
            slots=self._slot_views(),
        )

    async def generate(self, requests: Sequence[GenerateRequest]) -> Generation:
        for r in requests:
            check_context(r, self._info)  # the engine's own rules
            check_logit_bias(r.sampling, self._info)  # the engine's own rule
            if r.sampling.grammar is not None and "root" not in r.sampling.grammar:
                raise InvalidRequestError("invalid grammar: no root rule", param="grammar")
        if self.outstanding + len(requests) > self.capacity:
            raise QueueFullError()
        requests = unpinned_if_busy(self.sessions, requests)  # the engine's own rule
        session_id = requests[0].session_id if requests else None
        if session_id is not None:
            if len(requests) > 1:
                raise InvalidRequestError("a session continues one sequence", param="n")
            session, created = self.sessions.begin(
                requests[0].tenant, session_id, requests[0].session_pool
            )
            self.session_of[requests[0].request_id] = session
        self.submitted.extend(requests)
        self.stored.extend(requests)
        generation = Generation(
            [r.request_id for r in requests], self._abort, session_id, hold=self.held.extend
        )
        fail = self.fail_next
        self.fail_next = False
        reply = self.replies.pop(0).encode() if self.replies else self.reply
        for index, request in enumerate(requests):
            self.outstanding += 1
            self.running.add(request.request_id)
            task = asyncio.ensure_future(self._run(generation, index, request, fail, reply))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return generation

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if request_id in self.running:
                self.aborted.append(request_id)
                self.running.discard(request_id)

    async def _run(
        self, gen: Generation, index: int, request: GenerateRequest, fail: bool, reply: bytes
    ) -> None:
        detok = IncrementalDetokenizer(PIECES, request.stop)
        # The thinking tokens counted as the engine counts them (nothing is forced here).
        thinking = ThinkingBudget.of(request.thinking, default=UNLIMITED, free=False)
        produced = 0
        prompt = len(request.prompt_tokens)
        arrival = time.monotonic()
        first_token: float | None = None
        scored: tuple[TokenLogprob, ...] = ()
        if request.prompt_logprobs is not None:
            scored = tuple(TokenLogprob(t, -0.5) for t in request.prompt_tokens[1:])
        try:
            if request.max_tokens == 0:
                await asyncio.sleep(self.delay)
                gen.put(
                    index,
                    SeqOutput(
                        "",
                        (),
                        finish_reason=FinishReason.LENGTH,
                        num_prompt_tokens=prompt,
                        prompt_logprobs=scored,
                    ),
                )
                return
            # as the engine's worker announces a placed sequence (engine/thread/worker.py)
            gen.put(index, SeqOutput("", (), num_prompt_tokens=prompt,
                                     num_cached_tokens=self.cached))  # fmt: skip
            await asyncio.sleep(self.prefill_delay)
            for token in [*reply, EOS]:
                await asyncio.sleep(self.delay)
                if request.request_id not in self.running:
                    gen.put(index, SeqOutput("", (), finish_reason=FinishReason.ABORT))
                    return
                if fail:
                    gen.put(
                        index,
                        SeqOutput(
                            "",
                            (),
                            finish_reason=FinishReason.ERROR,
                            error=self.fail_error,
                        ),
                    )
                    return
                produced += 1
                first_token = first_token or time.monotonic()
                if thinking is not None and token != EOS:
                    thinking.accept(token)
                done: dict[str, Any] = dict(
                    num_prompt_tokens=prompt,
                    num_output_tokens=produced,
                    num_reasoning_tokens=thinking.num_tokens if thinking else 0,
                    num_cached_tokens=self.cached,
                    timings=Timings(arrival, arrival, arrival, first_token),
                )
                if token == EOS:
                    gen.put(
                        index, SeqOutput(detok.flush(), (), finish_reason=FinishReason.STOP, **done)
                    )
                    return
                text = detok.push(token)
                lp = ()
                if request.logprobs is not None:
                    top = tuple(
                        TopLogprob(t, -0.1 * (k + 1))
                        for k, t in enumerate([token, 32][: request.logprobs])
                    )
                    lp = (TokenLogprob(token, -0.1, top),)
                if detok.stopped:
                    gen.put(
                        index,
                        SeqOutput(text, (token,), lp, finish_reason=FinishReason.STOP,
                                  stop_sequence=detok.matched, **done),
                    )
                    return
                limit = request.max_tokens is not None and produced >= request.max_tokens
                if limit or (self.context_ends and prompt + produced >= self._info.n_ctx):
                    text += detok.flush()
                    gen.put(
                        index,
                        SeqOutput(text, (token,), lp, finish_reason=FinishReason.LENGTH, **done),
                    )
                    return
                gen.put(
                    index,
                    SeqOutput(text, (token,), lp, prompt_logprobs=scored if produced == 1 else ()),
                )
        finally:
            self.outstanding -= 1
            self.running.discard(request.request_id)
            session = self.session_of.pop(request.request_id, None)
            if session is not None:
                self.pinned.add(session.key)
                self.sessions.end(session, prompt + produced)

    # -- sessions and cache, as the real engine's facade has them ----------------------

    def create_session(
        self, tenant: str, session_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        return self.sessions.create(tenant, session_id, ttl_s)

    def get_session(self, tenant: str, session_id: str) -> Session:
        return self.sessions.get(tenant, session_id)

    def list_sessions(self, tenant: str) -> list[Session]:
        return self.sessions.owned_by(tenant)

    def all_sessions(self) -> list[Session]:
        return self.sessions.all()

    def _slot_views(self) -> tuple[SlotView, ...]:
        """Pinned sessions hold the first slots (idle, their tokens), the rest are free."""
        held = {s.key: s.num_tokens for s in self.sessions.all() if s.key in self.pinned}
        keys = sorted(held)
        return tuple(
            SlotView(i, False, keys[i], held[keys[i]]) if i < len(keys) else SlotView(i, False, None, 0)
            for i in range(self._info.n_seq_max)
        )

    def delete_session(self, tenant: str, session_id: str) -> Session:
        session = self.sessions.get(tenant, session_id)
        if session.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        self.sessions.remove(session)
        self.pinned.discard(session.key)
        return session

    def session_slot(self, key: str | None) -> int | None:
        return 0 if key in self.pinned else None

    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        source = self.sessions.get(tenant, session_id)
        if source.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        if self.fork_error is not None:
            raise NoSlotError(self.fork_error)
        target = self.sessions.create(tenant, new_id, ttl_s or source.ttl_s)
        target.num_tokens = source.num_tokens
        if source.key in self.pinned:
            self.pinned.add(target.key)
        return target

    def open_cache(self) -> None:
        pass  # the fake's "cache" (`stored`) is always there

    def cache_stats(self) -> CacheStats | None:
        return None

    def tenant_cache_view(self, tenant: str, owns: Callable[[str], bool]) -> TenantCacheView:
        """The fake "stores" one entry per finished request, under its salt."""
        mine = [r for r in self.stored if owns(r.prefix_salt)]
        kinds = {"cold": sum(r.tenant == tenant for r in self.submitted)}
        return TenantCacheView(len(mine), sum(len(r.prompt_tokens) for r in mine), tuple(kinds.items()), 0)

    def purge_cache(self, owns: Callable[[str], bool] | None = None) -> int:
        gone = [r for r in self.stored if owns is None or owns(r.prefix_salt)]
        self.stored = [r for r in self.stored if r not in gone]
        return len(gone)

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        out = []
        for tokens in inputs:
            digest = hashlib.sha256(bytes(t % 256 for t in tokens)).digest()
            vector = np.frombuffer(digest[:8], dtype=np.uint8).astype(np.float32) + 1.0
            out.append(vector / np.linalg.norm(vector))
        return out
