"""POST /api/generate (Ollama) on the serving core: a prompt, templated or raw, maybe with
the `context` of an earlier answer, or a prefix and `suffix` to fill in between.

- Templated (the default): `system` and `prompt` are rendered as one chat turn by the
  model's own template. `context` (the token ids a previous answer returned: its prompt
  and its output) goes in front, so a continuation's head is exactly the tokens that
  the engine holds from that answer and only the new turn is prefilled.
  `images` go in that turn, before the prompt's text (as Ollama places them).
- `raw`: the prompt is tokenized as it is (special tokens parsed), no template.
- `suffix`: fill in the middle, in llama.cpp's order (prefix-suffix-middle) with the
  vocabulary's own FIM tokens; refused for a model that has none.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request

from chat.formats import GrammarSpec
from chat.plan import ChatOptions, OutputParser
from chat.reasoning import has_thinking, think_kwargs
from chat.schema import SchemaError, json_object_gbnf, schema_to_gbnf
from engine.client import Media, ThinkingSpec
from server.api.ollama.common import (
    Piece,
    answer,
    check_num_ctx,
    content_with_images,
    kept_model,
    load_answer,
    within_window,
)
from server.api.ollama.protocol import OllamaGenerateRequest
from server.errors import BadRequest, params_renamed
from server.http.deps import Caller, EngineLike
from server.models.keep_alive import apply_keep_alive
from server.models.served import ServedModel
from server.serving.drive import tokenize
from server.serving.engine_requests import generate_requests
from server.serving.media import media_of
from server.serving.prepare import grammar_fields, make_plan, prompt_tokens, with_images
from server.serving.state import ChoiceState
from server.serving.thinking import thinking_spec


def _grammar(body: OllamaGenerateRequest) -> GrammarSpec | None:
    if body.response_format == "json_object":
        return GrammarSpec(json_object_gbnf())
    if body.response_format == "json_schema":
        try:
            return GrammarSpec(schema_to_gbnf(body.format))
        except SchemaError as exc:
            raise BadRequest(str(exc), param="format") from None
    return None


async def _raw_prompt(engine: EngineLike, body: OllamaGenerateRequest, model: str) -> list[int]:
    """The tokens of a raw prompt, or of a fill-in-the-middle one."""
    info = engine.info
    if not body.suffix:
        return await tokenize(engine, body.prompt, add_special=info.add_bos, parse_special=True)
    if info.fim_tokens is None:
        raise BadRequest(f'"{model}" does not support insert', param="suffix")
    pre, suf, mid = info.fim_tokens
    head = await tokenize(engine, body.prompt, add_special=False, parse_special=False)
    tail = await tokenize(engine, body.suffix, add_special=False, parse_special=False)
    bos = engine.tokenize("", add_special=True, parse_special=False) if info.add_bos else []
    return [*bos, pre, *head, suf, *tail, mid]


Templated = tuple[list[int], OutputParser, GrammarSpec | None, ThinkingSpec | None,
                  tuple[Media, ...]]  # fmt: skip


async def _templated(request: Request, served: ServedModel, body: OllamaGenerateRequest
                     ) -> Templated:  # fmt: skip
    """The context's tokens, then the new turn rendered by the model's template; its
    thinking block (server/serving/thinking.py) and its images."""
    template = served.template
    kwargs: dict[str, Any] = {}
    if body.think is not None:  # true or a level on a model that cannot think: Ollama's 400
        if body.think is not False and not has_thinking(template.source):
            raise BadRequest(f'"{body.model}" does not support thinking', param="think")
        kwargs.update(think_kwargs(body.think))  # the switch, or a level as an effort
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": content_with_images(body.prompt, body.images)})
    info = served.engine.info
    messages = await with_images(request, info, messages)
    fmt = body.response_format
    plan = make_plan(template, messages, ChatOptions(
        response_format=fmt,  # type: ignore[arg-type]
        json_schema=body.format if isinstance(body.format, dict) else None,
        template_kwargs=kwargs,
    ), media_marker=info.media_marker)  # fmt: skip
    context = list(body.context or [])
    n_vocab = served.engine.info.n_vocab
    bad = next((t for t in context if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise BadRequest(f"'context' contains token id {bad}, outside [0, {n_vocab})",
                         param="context")  # fmt: skip
    # With a context, the conversation's head is there already (its BOS included).
    turn = await prompt_tokens(served.engine, plan, add_special=False if context else None)
    spec = thinking_spec(served.engine, template.source, plan.prompt.text, None, kwargs)
    return context + turn, plan.parser(), plan.grammar, spec, media_of(plan.media)


def _format_param(param: str | None) -> str | None:
    """A structured-output field as Ollama spells it: every one is `format`."""
    return "format" if param and param.startswith("response_format") else param


async def serve_ollama_generate(
    body: OllamaGenerateRequest, request: Request, caller: Caller
) -> Any:
    started = time.monotonic()
    body.log_unknown("ollama.generate")
    served = kept_model(request, body.model, body.keep_alive)
    if not body.prompt and not body.suffix:
        return await load_answer(request, served, body.model, body.keep_alive, {"response": ""})
    engine = served.engine
    opts = body.options
    check_num_ctx(opts, engine.info.n_ctx)
    media: tuple[Media, ...] = ()
    if body.raw or body.suffix:
        if body.images:
            raise BadRequest("images go in a templated prompt; a raw or fill-in-the-middle "
                             "prompt has no place marked for them", param="images")  # fmt: skip
        if body.system or body.context:
            field = "system" if body.system else "context"
            raise BadRequest(f"'{field}' has no place in a fill-in-the-middle prompt",
                             param=field)  # fmt: skip
        prompt = await _raw_prompt(engine, body, body.model)
        parser, grammar, spec = OutputParser(None, None), _grammar(body), None
    else:
        with params_renamed(_format_param):
            prompt, parser, grammar, spec, media = await _templated(request, served, body)
    limit = within_window(opts, len(prompt))
    requests = generate_requests(prompt, opts.sampling_record(), engine.info,
                                 max_tokens=limit, logprobs=None, caller=caller,
                                 overrides=grammar_fields(grammar), thinking=spec,
                                 media=media)  # fmt: skip
    if body.keep_alive is not None:  # the request passed every check
        apply_keep_alive(served, body.keep_alive)
    generation = await engine.generate(requests)

    def shape(part: Piece) -> dict[str, Any]:
        return {"response": part.content, **({"thinking": part.thinking} if part.thinking else {})}

    return await answer(request, generation, ChoiceState(0, parser), model=body.model,
                        started=started,
                        stream=body.stream, shape=shape,
                        extra=lambda total: {"context": [*prompt, *total.token_ids]})  # fmt: skip
