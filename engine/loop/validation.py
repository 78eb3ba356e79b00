"""Validating a generation request against the loaded model, before anything is queued."""

from __future__ import annotations

import math

from engine.media import image_spans
from engine.types import GenerateRequest, InvalidRequestError, ModelInfo, SamplingParams


def validate(request: GenerateRequest, info: ModelInfo, projector: str | None = None) -> None:
    """Refuse (InvalidRequestError: 400, naming the field) what llama.cpp must never
    see: token ids outside the vocabulary, a context overrun, C ints that would
    truncate, unknown LoRA adapters, non-finite scales. `projector`: the identity of
    the model's vision projector (engine/llama/vision.py), None without one."""
    num_prompt = len(request.prompt_tokens)
    if num_prompt == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if request.media:
        _check_images(request, info, projector)
    elif any(t < 0 or t >= info.n_vocab for t in request.prompt_tokens):
        raise InvalidRequestError(
            f"prompt contains a token id outside [0, {info.n_vocab})", param="prompt"
        )
    check_context(request, info)
    _check_int32(request)
    if request.speculative and not info.speculative_ok:
        why = (
            f"drops rejected draft tokens, which the {info.family.memory} memory of "
            f"'{info.model_id}' ({info.family.architecture}) cannot (it keeps one state per "
            "sequence, not one per token)"
            if info.family is not None and info.family.whole_state
            else "needs flash_attn = true on this model (without it, verified drafts "
            "would not give plain decoding's tokens)"
        )
        raise InvalidRequestError(f"speculative decoding {why}", param="speculative")
    known = {a.id for a in info.loras}
    for adapter_id, scale in request.lora:
        if adapter_id not in known:
            raise InvalidRequestError(f"unknown LoRA adapter '{adapter_id}'", param="lora")
        if not math.isfinite(scale):
            raise InvalidRequestError("a LoRA scale must be a finite number", param="lora")
    check_logit_bias(request.sampling, info)
    _check_thinking(request, info)


def _check_images(request: GenerateRequest, info: ModelInfo, projector: str | None) -> None:
    """A prompt with images: ids < 0 only where tokenize_media put this request's
    images (engine/media.py), every other id in the vocabulary."""
    if projector is None:
        raise InvalidRequestError(f"'{info.model_id}' takes no images", param="image")
    if any(t >= info.n_vocab for t in request.prompt_tokens):
        raise InvalidRequestError(
            f"prompt contains a token id outside [0, {info.n_vocab})", param="prompt"
        )
    try:
        spans = image_spans(request.prompt_tokens, [m.digest for m in request.media], projector)
    except ValueError as exc:
        raise InvalidRequestError(f"the prompt's image positions: {exc}", param="prompt") from exc
    limit = info.max_image_positions
    for start, end, index in spans:
        if limit and end - start > limit:  # it could never be scheduled (engine/media.py)
            raise InvalidRequestError(
                f"image {index} takes {end - start} positions, more than the {limit} one "
                "engine step decodes an image in (set by n_batch, n_ubatch, n_seq_max and "
                "exact_reuse: docs/models.md, Vision models)",
                param=f"image {index}",
            )
    if request.prompt_logprobs is not None:  # an image position has no token to score
        raise InvalidRequestError(
            "prompt_logprobs cannot score a prompt with images", param="prompt_logprobs"
        )


def _check_thinking(request: GenerateRequest, info: ModelInfo) -> None:
    """Tags of at least one token, in the vocabulary; a budget of -1 (unlimited) or more."""
    spec = request.thinking
    if spec is None:
        return
    for name, tag in (("open", spec.open), ("close", spec.close)):
        if not tag or any(t < 0 or t >= info.n_vocab for t in tag):
            raise InvalidRequestError(f"the thinking block's {name} tag must be token ids "
                                      f"in [0, {info.n_vocab})", param="thinking")  # fmt: skip
    if spec.budget is not None and not -1 <= spec.budget <= _INT32[1]:
        raise InvalidRequestError(
            f"a thinking budget must be -1 (unlimited) or within [0, {_INT32[1]}]",
            param="thinking_budget_tokens",
        )


class ContextOverflowError(InvalidRequestError):
    """A prompt that leaves the context no room for the answer. Carries the figures, so
    that each API can word it the way its clients parse it (Anthropic's clients read
    the token counts back out of the message)."""

    def __init__(self, num_prompt: int, max_tokens: int | None, n_ctx: int):
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens. However, your "
            f"prompt has {num_prompt} tokens, which leaves no room for the completion.",
            param="messages",
            code="context_length_exceeded",
        )
        self.num_prompt = num_prompt
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx


def check_context(request: GenerateRequest, info: ModelInfo) -> None:
    """A max_tokens past what the context has left is not refused: the sequence ends
    with `length` where the context runs out (engine/thread/postprocess.py `out_of_room`), as
    llama-server and Ollama do (agents send 8,000-32,000 whatever the context). Only a
    prompt that leaves no room for one token is refused (max_tokens 0 scores a prompt
    that fills the context exactly)."""
    num_prompt = len(request.prompt_tokens)
    if not fits_context(num_prompt, request.max_tokens, info.n_ctx):
        raise ContextOverflowError(num_prompt, request.max_tokens, info.n_ctx)


def fits_context(num_prompt: int, max_tokens: int | None, n_ctx: int) -> bool:
    """Whether a prompt is admitted (`check_context`'s rule, which the server's
    drop_oldest fits a conversation to): room for one token after it, none for
    max_tokens 0; a larger max_tokens is cut where the context ends, never refused."""
    room_needed = 1 if max_tokens is None else min(max_tokens, 1)
    return num_prompt + room_needed <= n_ctx


def check_logit_bias(sampling: SamplingParams, info: ModelInfo) -> None:
    """Every biased token must be in the vocabulary (llama.cpp indexes the logits by it)."""
    for token, _ in sampling.logit_bias:
        if token < 0 or token >= info.n_vocab:
            raise InvalidRequestError(
                f"logit_bias names token {token}, outside [0, {info.n_vocab})",
                param="logit_bias",
            )


_INT32 = (-(2**31), 2**31 - 1)


def _check_int32(request: GenerateRequest) -> None:
    """Integers reach llama.cpp as C ints: ctypes would truncate larger ones silently."""
    fields = [(f, getattr(request.sampling, f)) for f in _SAMPLING_INTS]
    fields += [(f, getattr(request, f)) for f in ("max_tokens", "logprobs", "prompt_logprobs")]
    for name, value in fields:
        if value is not None and not _INT32[0] <= value <= _INT32[1]:
            raise InvalidRequestError(
                f"'{name}' must be within [{_INT32[0]}, {_INT32[1]}]", param=name
            )


_SAMPLING_INTS = (
    "top_k", "min_keep", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat",
)  # fmt: skip
