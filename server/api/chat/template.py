"""POST /apply-template (llama-server's): a chat request's prompt, rendered as
/v1/chat/completions renders it, without generating.

The same request model and the same plan as chat completions (messages, tools,
tool_choice, response_format, chat_template_kwargs, reasoning_effort; sampled tool turns
sent back render as sampled), so the prompt shown is the prompt a chat request with this
body prefills. Two differences, both llama-server's: `model` may be left out (the default
model's template), and `add_generation_prompt` (default true) may leave the assistant
turn's opening out. No turns are dropped to fit the context (`context_overflow`): the
whole conversation is rendered. The generation fields are accepted and play no part.

`render_chat` is also what /tokenize renders `messages` with (server/api/kvserve/
tokenize.py): app.py hands it over as `app.state.render_chat`, since one API package
imports no other.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from chat.plan import ChatPlan
from server.api.chat.input import chat_messages, chat_options
from server.api.chat.protocol import ChatCompletionRequest
from server.api.constraints import ConstraintFields
from server.errors import BadRequest
from server.http.deps import Caller, CallerDep, claim, registry, resolve_model
from server.http.lease import Lease, leased
from server.models.served import ServedModel
from server.serving.prepare import make_plan, with_images
from server.serving.replay import request_replay

log = logging.getLogger("kvserve.server")
router = APIRouter()

# The fields a prompt is rendered from (chat_messages, chat_options); the others a chat
# body may carry (sampling, n, stream, ...) are accepted and play no part here.
RENDERED = {"model", "messages", "add_generation_prompt", "tools", "tool_choice",
            "parallel_tool_calls", "response_format", "reasoning_effort", "reasoning_format",
            "chat_template_kwargs", *ConstraintFields.model_fields}  # fmt: skip


class ApplyTemplateRequest(ChatCompletionRequest):
    # llama-server's: the default model's template without one (optional here, unlike chat)
    model: str | None = None  # type: ignore[assignment]
    add_generation_prompt: bool = True

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.has_mcp:
            raise BadRequest("MCP tools are listed by their server when a chat turn runs; "
                             "they are not rendered here", param="tools")  # fmt: skip


Rendered = tuple[ServedModel, ChatPlan]  # the model that rendered, and its chat plan


async def render(request: Request, body: ApplyTemplateRequest, caller: Caller) -> Rendered:
    """The model the body names (or the default one) and its plan for the body's chat;
    the caller's sampled tool turns render as sampled."""
    body.log_unknown("apply-template")
    unused = sorted(body.model_fields_set - RENDERED)
    if unused:
        log.info("apply-template: fields that play no part in a prompt: %s", unused)
    if body.model is None:
        served = claim(registry(request).default)
    else:
        served = resolve_model(request, body.model)
    options = replace(chat_options(body), add_generation_prompt=body.add_generation_prompt)
    replay = request_replay(request, served.id, caller)
    lookup = replay.lookup if replay is not None else None
    # Images are read as a chat request reads them (refused as it refuses them; /tokenize
    # counts their positions); each renders as the model's media marker.
    info = served.engine.info
    messages = await with_images(request, info, chat_messages(body))
    # A long conversation renders for a while: off the event loop.
    plan = await asyncio.to_thread(make_plan, served.template, messages, options, lookup,
                                   media_marker=info.media_marker)  # fmt: skip
    return served, plan


async def render_chat(request: Request, fields: dict[str, Any], caller: Caller) -> Rendered:
    """`render` for a body another route parsed (/tokenize's `messages`): its fields are
    checked as /apply-template checks them, a bad one a 400 naming it."""
    try:
        body = ApplyTemplateRequest.model_validate(fields)
    except ValidationError as exc:  # answered as a route's own body errors are
        raise RequestValidationError(exc.errors()) from None
    return await render(request, body, caller)


@router.post("/apply-template")
async def apply_template(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[ApplyTemplateRequest], leased(ApplyTemplateRequest, default_model=True)],
) -> dict[str, Any]:
    """The prompt a chat request renders to (llama-server's), without generating."""
    _, plan = await render(request, lease.body, caller)
    return {"prompt": plan.prompt.text}
