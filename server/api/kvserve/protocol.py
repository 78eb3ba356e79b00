"""Request models of kvserve's own routes (/tokenize, /detokenize)."""

from __future__ import annotations

from server.api.common import RequestModel, TokenId


class TokenizeRequest(RequestModel):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(RequestModel):
    tokens: list[TokenId]
