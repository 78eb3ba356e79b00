"""A chat-shaped request -> its plan (prompt, grammar, parser) and its engine requests.

Every chat-like API (chat completions, Responses, Messages) reduces its request to
OpenAI-chat message dicts, `ChatOptions` and sampling fields, and comes through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat.formats import GrammarSpec
from chat.plan import ChatOptions, ChatPlan, plan_chat
from chat.template import ChatTemplate, TemplateError
from chat.tools import ChatInputError
from engine.client import GenerateRequest
from server.http.deps import Caller, EngineLike
from server.http.errors import BadRequest
from server.http.sampling import generate_requests
from server.serving.context_fit import plan_within_context
from server.serving.drive import tokenize
from server.serving.request_sampling import RequestSampling
from server.serving.state import ChoiceState

# The most messages one chat request may render (its history included): every render
# and tokenization is linear in them (seconds of CPU at this size), and drop_oldest
# renders a few times. Far beyond any context; the body limit alone would let ~280,000 in.
MAX_MESSAGES = 100_000


def check_message_count(messages: list[dict[str, Any]]) -> None:
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"the conversation has {len(messages):,} messages; at most "
                         f"{MAX_MESSAGES:,} are accepted", param="messages")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Prepared:
    plan: ChatPlan
    prompt: list[int]
    requests: list[GenerateRequest]
    dropped: int = 0  # messages left out to fit the context (context_overflow drop_oldest)

    def states(self) -> list[ChoiceState]:
        return [ChoiceState(i, self.plan.parser()) for i in range(len(self.requests))]


def make_plan(
    template: ChatTemplate, messages: list[dict[str, Any]], options: ChatOptions
) -> ChatPlan:
    """The chat plan; what the template or tool checks refuse is a 400 naming the field."""
    check_message_count(messages)
    try:
        return plan_chat(template, messages, options)
    except TemplateError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except ChatInputError as exc:
        raise BadRequest(exc.message, param=exc.param) from exc


async def prompt_tokens(engine: EngineLike, plan: ChatPlan) -> list[int]:
    rendered = plan.prompt
    return await tokenize(engine, rendered.text, add_special=rendered.add_bos, parse_special=True)


async def prepare_chat(
    engine: EngineLike,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    options: ChatOptions,
    sampling: RequestSampling,
    caller: Caller,
    *,
    max_tokens: int | None,
    logprobs: int | None = None,
    overflow: str = "error",
) -> Prepared:
    check_message_count(messages)
    try:
        plan, prompt, dropped = await plan_within_context(
            engine, template, messages, options, max_tokens, overflow
        )
    except TemplateError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except ChatInputError as exc:
        raise BadRequest(exc.message, param=exc.param) from exc
    requests = generate_requests(
        prompt,
        sampling,
        engine.info,
        max_tokens=max_tokens,
        logprobs=logprobs,
        caller=caller,
        overrides=grammar_fields(plan.grammar),
    )
    return Prepared(plan, prompt, requests, dropped)


def grammar_fields(spec: GrammarSpec | None) -> dict[str, object]:
    """SamplingParams fields for a grammar (its trigger words are tokenized by the engine)."""
    if spec is None:
        return {}
    return {
        "grammar": spec.gbnf,
        "grammar_lazy": spec.lazy,
        "grammar_trigger_patterns": tuple(spec.trigger_patterns),
        "grammar_trigger_words": tuple(spec.trigger_words),
    }
