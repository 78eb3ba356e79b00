"""POST /tokenize, POST /detokenize (llama-server's shapes).

/tokenize takes text (`content`), or a chat (`messages`, with the rest of an
/apply-template body): the prompt /v1/chat/completions would render, tokenized as it
tokenizes it (server/api/chat/template.py renders it; app.py hands its `render_chat`
over, as one API package imports no other). Both take an optional `model` (the default
model's vocabulary without one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Request

from chat.plan import ChatPlan
from server.api.kvserve.protocol import DetokenizeRequest, TokenizeRequest
from server.errors import BadRequest
from server.http.deps import (
    Caller,
    CallerDep,
    EngineLike,
    claim,
    registry,
    resolve_model,
)
from server.http.lease import Lease, leased
from server.models.served import ServedModel
from server.serving.drive import tokenize as tokenize_text
from server.serving.prepare import prompt_tokens

router = APIRouter()

# server/api/chat/template.py's render_chat: the model and the chat plan of a chat body
ChatRenderer = Callable[[Request, dict[str, Any], Caller], Awaitable[tuple[ServedModel, ChatPlan]]]


def _engine(request: Request, model: str | None) -> EngineLike:
    if model is None:
        return claim(registry(request).default).engine
    return resolve_model(request, model).engine


@router.post("/tokenize")
async def tokenize(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[TokenizeRequest], leased(TokenizeRequest, default_model=True)],
) -> dict[str, Any]:
    """Turn text, or a chat's prompt, into the model's token ids."""
    body = lease.body
    if body.messages is not None:
        render: ChatRenderer = request.app.state.render_chat
        fields = {**(body.model_extra or {}), "messages": body.messages}
        if body.model is not None:
            fields["model"] = body.model
        served, plan = await render(request, fields, caller)
        engine = served.engine
        tokens = await prompt_tokens(engine, plan)
    else:
        body.log_unknown("tokenize")
        engine = _engine(request, body.model)
        tokens = await tokenize_text(
            engine,
            body.content or "",
            add_special=bool(body.add_special),
            parse_special=body.parse_special is not False,  # default true, as llama-server
        )
    if body.with_pieces:
        # An image's positions (ids < 0, a chat with images) have no text: an empty piece.
        return {"tokens": [{"id": t, "piece": piece(engine.special_piece(t)) if t >= 0 else ""}
                           for t in tokens]}  # fmt: skip
    return {"tokens": tokens}


def piece(raw: bytes) -> str | list[int]:
    """A token's piece as llama-server shows it: its text, special tokens included; the
    bytes as numbers where they are not valid UTF-8 on their own (part of a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


@router.post("/detokenize")
async def detokenize(
    request: Request,
    lease: Annotated[Lease[DetokenizeRequest], leased(DetokenizeRequest, default_model=True)],
) -> dict[str, Any]:
    """Turn token ids back into text (special tokens as their text, as llama-server)."""
    body = lease.body
    body.log_unknown("detokenize")
    engine = _engine(request, body.model)
    n_vocab = engine.info.n_vocab
    bad = next((t for t in body.tokens if t >= n_vocab), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside [0, {n_vocab})", param="tokens")
    text = engine.detokenize(
        body.tokens, remove_special=body.remove_special, unparse_special=body.unparse_special
    )
    return {"content": text}
