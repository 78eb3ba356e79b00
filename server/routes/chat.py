"""POST /v1/chat/completions"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from chat.plan import ChatPlan
from chat.template import TemplateError
from chat.tools import ChatInputError
from engine.engine import Generation
from engine.types import FinishReason, TokenLogprob
from server.chat_tools import chat_messages, chat_options, grammar_fields, message, stream_deltas
from server.context_fit import DROPPED_HEADER, plan_within_context
from server.deps import CallerDep, EngineLike, resolve_model
from server.errors import BadRequest, from_engine_error
from server.generation import (
    Choice,
    ClientDisconnected,
    check_n,
    chunk_framing,
    client_gone,
    collect,
    engine_failure,
    event_stream,
    finish_reason_text,
    increments,
    new_id,
    now,
    until_disconnect,
    usage,
)
from server.protocol import ChatCompletionRequest
from server.sampling import generate_requests

log = logging.getLogger("kvserve.server")
router = APIRouter()


def logprob_entry(engine: EngineLike, lp: TokenLogprob) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = engine.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    entry = one(lp.token_id, lp.logprob)
    entry["top_logprobs"] = [one(t.token_id, t.logprob) for t in lp.top]
    return entry


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, response: Response, caller: CallerDep
) -> Any:
    """Create a model response for the given chat conversation."""
    body.log_unknown("chat.completions")
    body.refuse_unsupported()
    served = resolve_model(request, body.model)
    engine, template = served.engine, served.template
    info = engine.info
    check_n(body.n, info.n_seq_max)
    max_tokens = body.max_completion_tokens or body.max_tokens
    try:
        plan, prompt, dropped = await plan_within_context(
            engine, template, chat_messages(body), chat_options(body), max_tokens,
            served.context_overflow,
        )  # fmt: skip
    except TemplateError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except ChatInputError as exc:
        raise BadRequest(exc.message, param=exc.param) from exc
    response.headers[DROPPED_HEADER] = str(dropped)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    requests = generate_requests(
        prompt,
        body,
        info,
        max_tokens=max_tokens,
        logprobs=logprobs,
        caller=caller,
        overrides=grammar_fields(plan.grammar, engine),
    )
    try:
        generation = await engine.generate(requests)
    except Exception as exc:
        raise from_engine_error(exc) from exc

    response_id = new_id("chatcmpl")
    created = now()
    log.info(
        "chat.completion %s: %d prompt tokens, n=%d, stream=%s, user=%s",
        response_id,
        len(prompt),
        body.n,
        body.stream,
        body.user,
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(
            engine, generation, plan, body.n, len(prompt), response_id, created, include_usage
        )
        stream = event_stream(events, on_close=generation.abort)
        stream.headers[DROPPED_HEADER] = str(dropped)
        return stream

    try:
        choices = await until_disconnect(request, collect(generation, body.n))
    except ClientDisconnected:
        return client_gone()
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": info.model_id,
        "system_fingerprint": None,
        "choices": [_choice(engine, plan, i, c, body.logprobs) for i, c in enumerate(choices)],
        "usage": usage(choices, len(prompt)),
    }


def _finish_text(reason: FinishReason | None, num_calls: int) -> str | None:
    if reason is FinishReason.STOP and num_calls:
        return "tool_calls"
    return finish_reason_text(reason)


def _choice(
    engine: EngineLike, plan: ChatPlan, index: int, choice: Choice, logprobs: bool
) -> dict[str, Any]:
    parser = plan.parser()
    msg = message(parser, "".join(choice.text))
    return {
        "index": index,
        "message": msg,
        "logprobs": (
            {"content": [logprob_entry(engine, lp) for lp in choice.logprobs], "refusal": None}
            if logprobs
            else None
        ),
        "finish_reason": _finish_text(choice.finish_reason, len(msg.get("tool_calls", []))),
    }


async def _stream(
    engine: EngineLike,
    generation: Generation,
    plan: ChatPlan,
    n: int,
    num_prompt_tokens: int,
    response_id: str,
    created: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    model = engine.info.model_id
    head, tail = chunk_framing("chat.completion.chunk", response_id, created, model, include_usage)

    def chunk(choices: list[dict[str, Any]]) -> str:
        return head + json.dumps(choices, ensure_ascii=False) + tail

    totals = [Choice() for _ in range(n)]
    parsers = [plan.parser() for _ in range(n)]
    yield chunk(
        [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(n)
        ]
    )
    async for increment in increments(generation):
        parts = []
        for index, inc in increment:
            if inc.finish_reason is FinishReason.ERROR:
                yield json.dumps(engine_failure(inc.error).body())
                return
            if inc.finish_reason is not None:  # the counts come with the finish
                totals[index] = inc
            parser = parsers[index]
            pieces = parser.feed("".join(inc.text))
            if inc.finish_reason is not None:
                pieces += parser.finish()
            deltas = stream_deltas(pieces)
            finish = _finish_text(inc.finish_reason, parser.num_calls)
            if not deltas and not inc.logprobs and finish is None:
                continue
            for extra in deltas[:-1]:  # a call's opening chunk goes on its own
                parts.append(
                    {"index": index, "delta": extra, "logprobs": None, "finish_reason": None}
                )
                yield chunk(parts)
                parts = []
            parts.append(
                {
                    "index": index,
                    "delta": deltas[-1] if deltas else {},
                    "logprobs": (
                        {
                            "content": [logprob_entry(engine, lp) for lp in inc.logprobs],
                            "refusal": None,
                        }
                        if inc.logprobs
                        else None
                    ),
                    "finish_reason": finish,
                }
            )
        if parts:
            yield chunk(parts)
    if include_usage:
        yield json.dumps(
            {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [],
                "usage": usage(totals, num_prompt_tokens),
            }
        )
    yield "[DONE]"
