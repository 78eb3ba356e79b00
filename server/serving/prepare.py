"""A chat-shaped request -> its plan (prompt, grammar, parser) and its engine requests.

Every chat-like API (chat completions, Responses, Messages) reduces its request to
OpenAI-chat message dicts, `ChatOptions` and sampling fields, and comes through here.

Context overflow for chat: refuse (400 `context_length_exceeded`, the default) or,
with a model's `context_overflow = "drop_oldest"`, drop the oldest turns after the
system messages until the prompt is admitted by the engine's rule (room for one token:
a `max_tokens` past the context is cut where it ends, so it drops nothing). The response
says how many messages went in the `X-Kvserve-Dropped-Messages` header.

Rendering and tokenizing a long conversation takes CPU time: it runs in a worker
thread, so the event loop serves other requests meanwhile, and the cut is found in
O(log n) renders (a search over the number of dropped turns), never one per turn. A
short conversation renders inline: a thread hop would only add to its latency.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request

from chat.formats import GrammarSpec
from chat.plan import ChatOptions, ChatPlan, plan_chat
from chat.reasoning import thinking_syntax
from chat.replay import ReplayedPrompt, TurnLookup
from chat.template import ChatTemplate, RenderedPrompt, TemplateError
from chat.tools import ChatInputError
from engine.client import GenerateRequest, ModelInfo, fits_context
from server.errors import BadRequest
from server.http.deps import Caller, EngineLike
from server.serving.drive import TOKENIZE_INLINE_CHARS
from server.serving.engine_requests import RequestSampling, generate_requests
from server.serving.media import media_of, read_images, tokenize_images
from server.serving.replay import Recorder, Replay
from server.serving.spliced import spliced_ids
from server.serving.state import Choice, ChoiceState, Step
from server.serving.thinking import thinking_spec

# The most messages one chat request may render (its history included): every render
# and tokenization is linear in them (seconds of CPU at this size), and drop_oldest
# renders a few times. Far beyond any context; the body limit alone would let ~280,000 in.
MAX_MESSAGES = 100_000
DROPPED_HEADER = "X-Kvserve-Dropped-Messages"

Fitted = tuple[ChatPlan, list[int], int]  # the plan, its prompt tokens, messages dropped
INLINE_MESSAGES = 64  # at most this many messages (and short ones) render on the event loop
# The caller's memory of sampled tool turns (server/serving/replay.py request_replay),
# opened only by a request that can use it.
ReplaySource = Callable[[], Replay | None]


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
    recorder: Recorder | None = None  # keeps the tool turns sampled (server/serving/replay.py)

    @property
    def plain_text(self) -> bool:
        """Its output is content as sampled: no reasoning to split, no calls to parse."""
        return self.plan.tool_format is None and not self.plan.split_reasoning

    def states(self) -> list[ChoiceState]:
        """One state per choice, for a stream (each records its turn when it finishes)."""
        return [self._state(i) for i in range(len(self.requests))]

    def finish(self, index: int, choice: Choice) -> Step:
        """A whole choice parsed at once (a plain request), its turn recorded."""
        return self._state(index).advance(choice)

    def _state(self, index: int) -> ChoiceState:
        on_finish = self.recorder.finished if self.recorder is not None else None
        return ChoiceState(index, self.plan.parser(), on_finish=on_finish)


def has_parts(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a message's content is a list of parts: only such a message can carry an
    image (server/serving/media.py chat_part), so a text-only request runs no image code."""
    return any(isinstance(m.get("content"), list) for m in messages)


async def with_images(
    request: Request, info: ModelInfo, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The messages with their images read (server/serving/media.py read_images, with the
    app's `[media]` settings); the same list where no message has parts."""
    if not has_parts(messages):
        return messages
    return await read_images(messages, info, request.app.state.settings.media)


def make_plan(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    options: ChatOptions,
    replay: TurnLookup | None = None,
    *,
    media_marker: str = "",
) -> ChatPlan:
    """The chat plan; what the template or tool checks refuse is a 400 naming the field.
    `replay`: sampled tool turns sent back render as sampled (as in `prepare_chat`);
    `media_marker`: the engine's, where the messages may carry images."""
    check_message_count(messages)
    try:
        return plan_chat(template, messages, replace(options, media_marker=media_marker), replay)
    except TemplateError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except ChatInputError as exc:
        raise BadRequest(exc.message, param=exc.param) from exc


async def prompt_tokens(
    engine: EngineLike, plan: ChatPlan, *, add_special: bool | None = None
) -> list[int]:
    """The plan's prompt tokens (`add_special`: None, as the template says)."""
    rendered = plan.prompt
    special = rendered.add_bos if add_special is None else add_special
    if plan.media or len(rendered.text) > TOKENIZE_INLINE_CHARS:  # blocking: a worker thread
        return await asyncio.to_thread(prompt_ids, engine, rendered, plan.media,
                                       add_special=special)  # fmt: skip
    return prompt_ids(engine, rendered, plan.media, add_special=special)


def plan_tokens(engine: EngineLike, plan: ChatPlan) -> list[int]:
    """The plan's prompt tokens, its images' positions and its replayed turns' sampled
    ids included (blocking)."""
    return prompt_ids(engine, plan.prompt, plan.media, add_special=plan.prompt.add_bos)


def prompt_ids(
    engine: EngineLike, rendered: RenderedPrompt, images: Sequence[Any], *, add_special: bool
) -> list[int]:
    """The prompt's ids (blocking): its images' positions included, its sampled turns as
    sampled where their ids spell their text (server/serving/spliced.py), else as the
    text tokenizes."""
    if isinstance(rendered, ReplayedPrompt) and rendered.splices:
        tokenize = functools.partial(text_ids, engine)
        ids = spliced_ids(engine, rendered.text, rendered.splices, images, add_special, tokenize)
        if ids is not None:
            return ids
    return text_ids(engine, rendered.text, images, add_special)


def text_ids(engine: EngineLike, text: str, images: Sequence[Any], add_special: bool) -> list[int]:
    """A text's ids, with the positions of the images its markers stand for (blocking)."""
    if images:
        return tokenize_images(engine, text, images, add_special=add_special)
    return engine.tokenize(text, add_special=add_special, parse_special=True)


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
    replay: ReplaySource | None = None,
    thinking_budget: int | None = None,
    window: Callable[[int], int | None] | None = None,
) -> Prepared:
    """`max_tokens`: the limit the prompt is fitted to the context with, and the
    requests' own unless `window` (Ollama's `num_ctx`) gives theirs from the prompt's
    length once it is known, so each request is built once with its final limit.
    `replay`: the caller's sampled tool turns (server/serving/replay.py), opened where
    the messages send a tool turn back (it renders as sampled) or the plan's parser can
    read calls (this request's own are recorded); a request that can do neither runs no
    replay code.
    `thinking_budget`: the one the request names (server/serving/thinking.py).
    Images in the messages are read already (`with_images`); the requests carry those of
    the prompt, in order."""
    check_message_count(messages)
    options = replace(options, media_marker=engine.info.media_marker)
    memory = replay() if replay is not None and _sends_tool_turns(messages) else None
    lookup = memory.lookup if memory is not None else None
    try:
        plan, prompt, dropped = await plan_within_context(
            engine, template, messages, options, max_tokens, overflow, lookup
        )
    except TemplateError as exc:
        raise BadRequest(str(exc), param="messages") from exc
    except ChatInputError as exc:
        raise BadRequest(exc.message, param=exc.param) from exc
    spec = None  # a template without a thinking block, and no budget named: no spec to make
    if thinking_budget is not None or thinking_syntax(template.source) is not None:
        spec = thinking_spec(engine, template.source, plan.prompt.text, thinking_budget,
                             options.template_kwargs)  # fmt: skip
    requests = generate_requests(
        prompt,
        sampling,
        engine.info,
        max_tokens=max_tokens if window is None else window(len(prompt)),
        logprobs=logprobs,
        caller=caller,
        overrides=grammar_fields(plan.grammar),
        thinking=spec,
        media=media_of(plan.media) if plan.media else (),
    )
    recorder = None
    if replay is not None and plan.tool_format is not None:  # only its parser reads calls
        memory = memory or replay()
        recorder = Recorder(memory, plan.prompt.text) if memory is not None else None
    return Prepared(plan, prompt, requests, dropped, recorder)


def _sends_tool_turns(messages: list[dict[str, Any]]) -> bool:
    """Whether an assistant turn with tool calls is sent back: only such a turn may
    render as it was sampled (chat/replay.py render_replaying looks up no other)."""
    return any(m.get("role") == "assistant" and m.get("tool_calls") for m in messages)


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


async def plan_within_context(
    engine: EngineLike,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    opts: ChatOptions,
    max_tokens: int | None,
    overflow: str,
    replay: TurnLookup | None = None,
) -> Fitted:
    """The plan, its prompt tokens, and how many messages were dropped to fit. What
    still does not fit is left to the engine's 400."""
    starts = turn_starts(messages)

    def attempt(turn: int) -> tuple[Fitted, bool]:
        """The plan that keeps the turns from `turn` on, and whether it fits."""
        kept = keep_turns_from(messages, starts, turn)
        plan = plan_chat(template, kept, opts, replay)
        prompt = plan_tokens(engine, plan)
        # The engine's own admission rule, not the whole max_tokens: a max_tokens past
        # the context is cut where it ends (engine/loop/validation.py check_context), so
        # an agent's max_tokens 32000 on a 32k context must not drop every earlier turn.
        fits = fits_context(len(prompt), max_tokens, engine.info.n_ctx)
        return (plan, prompt, len(messages) - len(kept)), fits

    def fit() -> Fitted:
        return _fewest_dropped(attempt, len(starts), overflow == "drop_oldest")

    if _is_short(messages):
        return fit()
    return await asyncio.to_thread(fit)


def _is_short(messages: list[dict[str, Any]]) -> bool:
    if len(messages) > INLINE_MESSAGES:
        return False
    if has_parts(messages):
        return False  # images: decoding them blocks
    chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
    return chars <= TOKENIZE_INLINE_CHARS


def _fewest_dropped(
    attempt: Callable[[int], tuple[Fitted, bool]], num_turns: int, drop: bool
) -> Fitted:
    """The attempt that keeps the most turns and fits (or keeps the last turn alone),
    if turns may be dropped; else the whole conversation's."""
    whole, fits = attempt(0)
    if fits or not drop or num_turns == 1:
        return whole
    # Fewer kept turns never make a longer prompt, so the first turn to keep is found by
    # searching: from the last turn backwards in doubling steps (a long history that
    # cannot fit is rarely rendered whole again), then by halving between the two
    # bounds. `failing` does not fit; `best` fits (or is the last turn alone).
    last = num_turns - 1
    best, fits = attempt(last)
    if not fits:
        return best
    failing, fitting, step = 0, last, 1
    while fitting - step > failing:
        candidate, fits = attempt(fitting - step)
        if not fits:
            failing = fitting - step
            break
        best, fitting, step = candidate, fitting - step, step * 2
    while fitting - failing > 1:
        middle = (failing + fitting) // 2
        candidate, fits = attempt(middle)
        if fits:
            best, fitting = candidate, middle
        else:
            failing = middle
    return best


def turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Where each turn after the leading system messages starts: the first message
    after them, then every later user message. A turn is a user message and everything
    up to the next user message (its answer, tool calls and tool results go together,
    so no result loses its call)."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    later = (i for i in range(start + 1, len(messages)) if messages[i]["role"] == "user")
    return [start, *later]


def keep_turns_from(
    messages: list[dict[str, Any]], starts: list[int], turn: int
) -> list[dict[str, Any]]:
    """The leading system messages and the turns from `turn` (an index into `starts`)
    on; the turns before it are dropped."""
    return messages[: starts[0]] + messages[starts[turn] :]
