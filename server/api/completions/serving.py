"""OpenAI legacy Completions on the serving core: raw prompts, echo, legacy logprobs."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from engine.client import EngineLike, FinishReason, Generation, TokenLogprob
from server.api.completions.protocol import CompletionRequest
from server.errors import BadRequest
from server.http.deps import Caller, resolve_engine
from server.serving import sse
from server.serving.drive import (
    check_n,
    collect,
    engine_failure,
    increments,
    new_id,
    now,
    until_disconnect,
)
from server.serving.engine_requests import generate_requests
from server.serving.prompts import prompt_token_lists
from server.serving.state import Choice, finish_reason_text, usage
from server.serving.timings import timings, with_timings

log = logging.getLogger("kvserve.server")


def completion_logprobs(
    engine: EngineLike, logprobs: list[TokenLogprob], offset: int
) -> tuple[dict[str, Any], int]:
    """OpenAI's legacy logprobs object, and the text offset after its last token."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for lp in logprobs:
        text = engine.token_bytes(lp.token_id).decode("utf-8", "replace")
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        top.append(
            {engine.token_bytes(t.token_id).decode("utf-8", "replace"): t.logprob for t in lp.top}
        )
        offsets.append(offset)
        offset += len(text)
    body = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }
    return body, offset


async def serve_completion(body: CompletionRequest, request: Request, caller: Caller) -> Any:
    body.log_unknown("completions")
    engine = resolve_engine(request, body.model)
    info = engine.info
    check_n(body.n, info.n_seq_max)
    prompts = await prompt_token_lists(engine, body.prompt)
    if len(prompts) > 1 and (body.session_id or caller.session_header):
        raise BadRequest("a session continues one prompt; send one per request", param="prompt")
    echoes = [engine.detokenize(p) if body.echo else "" for p in prompts]
    response_id = new_id("cmpl")
    created = now()
    log.info(
        "completion %s: %d prompt(s), n=%d, stream=%s, user=%s",
        response_id,
        len(prompts),
        body.n,
        body.stream,
        body.user,
    )

    # Echo with logprobs scores the prompt too (and max_tokens 0 scores it only).
    scores_prompt = body.echo and body.logprobs is not None
    if body.max_tokens == 0 and not scores_prompt:  # echo only: nothing to compute
        choices = [
            _choice(
                engine, p * body.n + i, echoes[p], Choice(finish_reason=FinishReason.LENGTH), None
            )
            for p in range(len(prompts))
            for i in range(body.n)
        ]
        totals = usage([], sum(len(p) for p in prompts))
        whole = _response(response_id, created, info.model_id, choices, totals)
        if not body.stream:
            return whole
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse.event_stream(_echo_stream(whole, include_usage), on_close=lambda: None)

    generations = await _start(engine, prompts, body, caller, scores_prompt)
    num_prompt_tokens = sum(len(p) for p in prompts)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(
            engine,
            generations,
            body,
            echoes,
            num_prompt_tokens,
            response_id,
            created,
            include_usage,
        )

        def abort_all() -> None:
            for generation in generations:
                generation.abort()

        return sse.event_stream(events, on_close=abort_all)

    async def run_all() -> list[list[Choice]]:
        return list(await asyncio.gather(*(collect(g, body.n) for g in generations)))

    try:
        results = await until_disconnect(request, run_all())
    finally:
        for generation in generations:
            generation.abort()
    flat = [c for per_prompt in results for c in per_prompt]
    choices = [
        _choice(engine, p * body.n + i, echoes[p], c, body.logprobs, prompts[p])
        | ({"tokens": c.token_ids} if body.return_tokens else {})  # llama-server's
        for p, per_prompt in enumerate(results)
        for i, c in enumerate(per_prompt)
    ]
    reply = _response(response_id, created, info.model_id, choices, usage(flat, num_prompt_tokens))
    if body.timings_per_token:  # llama-server's (server/serving/timings.py)
        reply["timings"] = timings(flat, num_prompt_tokens)
    return reply


async def _start(
    engine: EngineLike,
    prompts: list[list[int]],
    body: CompletionRequest,
    caller: Caller,
    scores_prompt: bool,
) -> list[Generation]:
    """One generation (of n choices) per prompt; all or none are started."""
    generations: list[Generation] = []
    sampling = body.sampling_record()
    try:
        for prompt in prompts:
            requests = generate_requests(
                prompt,
                sampling,
                engine.info,
                max_tokens=body.max_tokens,
                logprobs=body.logprobs,
                prompt_logprobs=body.logprobs if scores_prompt else None,
                caller=caller,
            )
            generations.append(await engine.generate(requests))
    except BaseException:  # the engine error itself is answered by its handler
        for generation in generations:
            generation.abort()
        raise
    return generations


async def _echo_stream(whole: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
    """The stream of an echo-only request: the echoed choices, then usage if asked."""
    yield json.dumps({**whole, "usage": None} if include_usage else _without_usage(whole))
    if include_usage:
        yield json.dumps({**whole, "choices": []})
    yield sse.DONE


def _without_usage(whole: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in whole.items() if k != "usage"}


def _response(
    response_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    totals: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": totals,
    }


def _choice(
    engine: EngineLike,
    index: int,
    echo: str,
    choice: Choice,
    logprobs: int | None,
    prompt: list[int] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] | None = None
    if logprobs is not None:
        offset = 0
        if echo and prompt:
            out, offset = _prompt_logprobs(engine, prompt, choice.prompt_logprobs)
        part, _ = completion_logprobs(engine, choice.logprobs, offset)
        out = part if out is None else {k: out[k] + part[k] for k in out}
    return {
        "index": index,
        "text": echo + "".join(choice.text),
        "logprobs": out,
        "finish_reason": finish_reason_text(choice.finish_reason),
    }


def _prompt_logprobs(
    engine: EngineLike, prompt: list[int], scored: list[TokenLogprob]
) -> tuple[dict[str, Any], int]:
    """The echoed prompt's share of the legacy logprobs object. Its first token has no
    context to be predicted from: null, as OpenAI reports it."""
    first = engine.token_bytes(prompt[0]).decode("utf-8", "replace")
    rest, offset = completion_logprobs(engine, scored, len(first))
    return {
        "tokens": [first, *rest["tokens"]],
        "token_logprobs": [None, *rest["token_logprobs"]],
        "top_logprobs": [None, *rest["top_logprobs"]],
        "text_offset": [0, *rest["text_offset"]],
    }, offset


async def _stream(
    engine: EngineLike,
    generations: list[Generation],
    body: CompletionRequest,
    echoes: list[str],
    num_prompt_tokens: int,
    response_id: str,
    created: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    model = engine.info.model_id
    head, tail = sse.chunk_framing("text_completion", response_id, created, model, include_usage)
    queue: asyncio.Queue[tuple[int, list[tuple[int, Choice]]] | None] = asyncio.Queue()
    states = [
        _TextChoice(p * body.n + i, len(echoes[p]))
        for p in range(len(generations))
        for i in range(body.n)
    ]

    async def pump(p: int, generation: Generation) -> None:
        try:
            async for increment in increments(generation):
                await queue.put((p, increment))
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(p, g)) for p, g in enumerate(generations)]

    def last_timings() -> dict[str, Any] | None:
        """llama-server's timings, on the last chunk (once every choice has finished)."""
        totals = [s.total for s in states]
        done = all(t.finish_reason is not None for t in totals)
        return timings(totals, num_prompt_tokens) if body.timings_per_token and done else None

    try:
        if body.echo:
            echoed = [
                {
                    "index": p * body.n + i,
                    "text": echoes[p],
                    "logprobs": None,
                    "finish_reason": None,
                }
                for p in range(len(generations))
                for i in range(body.n)
            ]
            yield head + json.dumps(echoed, ensure_ascii=False) + tail
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            p, increment = item
            parts: list[dict[str, Any]] = []
            finals: list[dict[str, Any]] = []
            for i, inc in increment:
                if inc.finish_reason is FinishReason.ERROR:
                    yield sse.openai_error_tail(engine_failure(inc.error))
                    return
                state = states[p * body.n + i]
                part, final = state.advance(engine, inc, body.logprobs, body.return_tokens)
                parts += [part] if part else []
                finals += [final] if final else []
            if parts:
                yield head + json.dumps(parts, ensure_ascii=False) + tail
            if finals:
                last = head + json.dumps(finals, ensure_ascii=False) + tail
                yield with_timings(last, None if include_usage else last_timings())
        if include_usage:
            totals = usage([s.total for s in states], num_prompt_tokens)
            last = json.dumps(_response(response_id, created, model, [], totals))
            yield with_timings(last, last_timings())
        yield sse.DONE
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.abort()


@dataclass(slots=True)
class _TextChoice:
    """One streamed completion choice: its index, the text offset its legacy logprobs
    count from, and its totals (set by the finish)."""

    index: int
    offset: int
    total: Choice = field(default_factory=Choice)

    def advance(
        self, engine: EngineLike, inc: Choice, logprobs: int | None, return_tokens: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """This increment's text part, and its finish part (a chunk of its own, after the
        last text, as OpenAI sends it). `return_tokens`: the part carries the increment's
        token ids (llama-server's `tokens`)."""
        if inc.finish_reason is not None:
            self.total = inc
        text = "".join(inc.text)
        lp = None
        if logprobs is not None and inc.logprobs:
            lp, self.offset = completion_logprobs(engine, inc.logprobs, self.offset)
        part = None
        tokens = inc.token_ids if return_tokens else []
        if text or lp is not None or tokens:
            part = {"index": self.index, "text": text, "logprobs": lp, "finish_reason": None}
            if return_tokens:
                part["tokens"] = tokens
        finish = finish_reason_text(inc.finish_reason)
        final = None
        if finish is not None:
            final = {"index": self.index, "text": "", "logprobs": None, "finish_reason": finish}
        return part, final
