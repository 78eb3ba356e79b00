"""Request models of kvserve's own routes (/tokenize, /detokenize: llama-server's)."""

from __future__ import annotations

from typing import Any

from server.api.common import RequestModel, TokenId
from server.errors import BadRequest


class TokenizeRequest(RequestModel):
    content: str | None = None
    # kvserve's: a chat (the body of /apply-template), tokenized as chat completions
    # tokenizes its prompt; checked where it is rendered (server/api/chat/template.py).
    messages: list[Any] | None = None
    model: str | None = None  # the default model's vocabulary without one
    add_special: bool | None = None  # (content) default false
    parse_special: bool | None = None  # (content) default true
    with_pieces: bool = False

    def refuse_unsupported(self) -> None:
        if self.content is None and self.messages is None:
            raise BadRequest("'content' (text) or 'messages' (a chat) is required",
                             param="content")  # fmt: skip
        if self.content is not None and self.messages is not None:
            raise BadRequest("send 'content' or 'messages', not both", param="messages")
        for name in ("add_special", "parse_special"):
            if self.messages is not None and getattr(self, name) is not None:
                raise BadRequest(f"'{name}' applies to 'content': a chat's prompt is tokenized "
                                 "as chat completions tokenizes it", param=name)  # fmt: skip


class DetokenizeRequest(RequestModel):
    tokens: list[TokenId]
    model: str | None = None  # the default model's vocabulary without one
    # llama.cpp's llama_detokenize flags. As llama-server's /detokenize, special tokens
    # are written as their text by default.
    remove_special: bool = False  # the BOS/EOS the vocabulary adds, left out
    unparse_special: bool = True
