"""Raw prompts (a string, strings, token ids, lists of token ids) -> token lists, for the
APIs that take text or tokens as they are (completions, embeddings)."""

from __future__ import annotations

from typing import Any

from server.errors import BadRequest
from server.http.deps import EngineLike
from server.serving.drive import tokenize

MAX_PROMPTS = 64


async def prompt_token_lists(
    engine: EngineLike, prompt: Any, param: str = "prompt"
) -> list[list[int]]:
    """Normalise a string / strings / token ids / lists of token ids into token lists."""
    n_vocab = engine.info.n_vocab
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt)
    if not items:
        raise BadRequest(f"'{param}' must not be empty", param=param)
    if len(items) > MAX_PROMPTS:
        raise BadRequest(f"at most {MAX_PROMPTS} inputs per request", param=param)
    lists = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise BadRequest(f"{param}[{i}] is an empty string", param=param)
            tokens = await tokenize(
                engine, item, add_special=engine.info.add_bos, parse_special=False
            )
        else:
            tokens = list(item)
            if not tokens:
                raise BadRequest(f"{param}[{i}] is an empty token list", param=param)
            bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise BadRequest(
                    f"{param}[{i}] contains token id {bad}, outside [0, {n_vocab})", param=param
                )
        lists.append(tokens)
    return lists
