"""POST /api/chat (Ollama) on the serving core: messages, tools, format, think, options.

Ollama's messages map onto chat turns: an assistant's `tool_calls` (arguments as an
object) get ids, and each later `tool` message answers the first open call of its
`tool_name` (or the first open call at all), which is how the chat layer pairs them.
`thinking` sent back in an assistant turn goes to the template as `reasoning_content`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request

from chat.plan import ChatOptions
from chat.reasoning import has_thinking, think_kwargs
from server.api.common import function_tool
from server.api.ollama.common import (
    Piece,
    answer,
    check_num_ctx,
    content_with_images,
    kept_model,
    load_answer,
    within_window,
)
from server.api.ollama.protocol import OllamaChatRequest
from server.errors import BadRequest, params_renamed
from server.http.deps import Caller
from server.models.keep_alive import apply_keep_alive
from server.serving.prepare import prepare_chat, with_images
from server.serving.replay import request_replay


def chat_messages(body: OllamaChatRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for i, message in enumerate(body.messages):
        content = content_with_images(message.content, message.images, f"messages[{i}]")
        item: dict[str, Any] = {"role": message.role, "content": content}
        if message.role == "assistant" and message.thinking:
            item["reasoning_content"] = message.thinking
        if message.tool_calls:
            item["tool_calls"] = []
            for j, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{j}"
                fn = call.function  # its object as JSON text: the one type inward
                # (server/serving/state.py ParsedCall.arguments says why)
                item["tool_calls"].append({"id": call_id, "type": "function", "function": {
                    "name": fn.name, "arguments": json.dumps(fn.arguments)}})  # fmt: skip
                open_calls.append((call_id, fn.name))
        if message.role == "tool":
            match = [c for c in open_calls if c[1] == message.tool_name] or open_calls
            if match:
                call_id, name = match[0]
                open_calls.remove(match[0])
            else:  # a result with no call in the history: named by itself
                call_id, name = f"result_{i}", message.tool_name or ""
            item["tool_call_id"], item["name"] = call_id, message.tool_name or name
        out.append(item)
    return out


def chat_options(body: OllamaChatRequest, template_source: str, model: str) -> ChatOptions:
    tools = tuple(function_tool(t.function) for t in body.tools or [])
    kwargs: dict[str, Any] = {}
    if body.think is not None:  # true or a level on a model that cannot think: Ollama's 400
        if body.think is not False and not has_thinking(template_source):
            raise BadRequest(f'"{model}" does not support thinking', param="think")
        kwargs.update(think_kwargs(body.think))  # the switch, or a level as an effort
    return ChatOptions(
        tools=tools,
        response_format=body.response_format,  # type: ignore[arg-type]
        json_schema=body.format if isinstance(body.format, dict) else None,
        template_kwargs=kwargs,
    )


def _param(param: str | None) -> str | None:
    """A chat-layer field name as Ollama spells it."""
    if param is None:
        return None
    return param.replace("response_format.json_schema.schema", "format")


def message(part: Piece) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": part.content}
    if part.thinking:
        out["thinking"] = part.thinking
    if part.calls:
        out["tool_calls"] = part.calls
    return out


async def serve_ollama_chat(body: OllamaChatRequest, request: Request, caller: Caller) -> Any:
    started = time.monotonic()
    body.log_unknown("ollama.chat")
    served = kept_model(request, body.model, body.keep_alive)
    if not body.messages:
        return await load_answer(request, served, body.model, body.keep_alive,
                           {"message": {"role": "assistant", "content": ""}})  # fmt: skip
    engine = served.engine
    opts = body.options
    check_num_ctx(opts, engine.info.n_ctx)
    template = served.template
    overflow = served.context_overflow
    if body.truncate is not None:
        overflow = "drop_oldest" if body.truncate else "error"
    messages = await with_images(request, engine.info, chat_messages(body))
    with params_renamed(_param):
        prepared = await prepare_chat(
            engine, template, messages, chat_options(body, template.source, body.model),
            opts.sampling_record(), caller, max_tokens=opts.max_tokens, overflow=overflow,
            replay=lambda: request_replay(request, served.id, caller, by_calls=True),
            window=lambda num_prompt: within_window(opts, num_prompt),
        )  # fmt: skip
    if body.keep_alive is not None:  # the request passed every check
        apply_keep_alive(served, body.keep_alive)
    generation = await engine.generate(prepared.requests)
    (state,) = prepared.states()
    return await answer(request, generation, state, model=body.model,
                        started=started, stream=body.stream,
                        shape=lambda part: {"message": message(part)})  # fmt: skip
