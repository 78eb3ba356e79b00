"""Tool turns that keep their KV: a past assistant turn rendered as the text it was sampled as.

A client sends the model's tool calls back as parsed JSON; the template renders them
again, and that text differs from what the model sampled (key order, spacing, `True` for
`true`, one newline), so the next prompt diverges at the call and everything after it is
prefilled again, although the KV of the sampled text is still in the slot or the cache.

The server remembers what each such turn sampled (server/serving/replay.py); here a turn
it recognises is rendered with a unique mark as its content and no calls, and the mark is
replaced by the sampled text. That is right only where the text before the mark is the
very prompt the turn was sampled after (the template frames a past turn as it opened the
generation, and nothing before it changed): the digest of that prompt, stored with the
turn, must equal the digest of the text before the mark. A turn that fails the check (and
every later one: their prompts held it as it was then) renders from the template.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chat.template import RenderedPrompt, TemplateError

log = logging.getLogger("kvserve.chat")

# Renders after which a conversation gives up on replaying: the first render finds the
# first turn that does not match, the second keeps the turns before it; a third is for a
# template whose text before a turn depends on what comes after it.
_MAX_RENDERS = 3


@dataclass(frozen=True, slots=True)
class SampledTurn:
    """What the model generated for one assistant turn, and the prompt it followed."""

    text: str  # the turn's output as sampled (reasoning, content and calls), to its end
    prompt_digest: bytes  # prompt_digest() of the prompt text it was sampled after
    # The ids sampled for `text` (without the end-of-turn token, which the template
    # writes); () where unknown. Whether they spell `text` is checked where they are used.
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Splice:
    """A sampled turn in a replayed prompt: text[start:end] is its text, sampled as
    `token_ids` (() where unknown: then the text is tokenized)."""

    start: int
    end: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplayedPrompt(RenderedPrompt):
    """A prompt with sampled turns spliced into it, in order of their place in the text."""

    splices: tuple[Splice, ...] = ()


# An assistant message with tool_calls -> the sampled turns it may be (newest first).
TurnLookup = Callable[[Mapping[str, Any]], Sequence[SampledTurn]]


class MarkedRender(Protocol):
    """Renders a conversation (by default the request's) with the marked turns' content
    replaced by their marks (message index -> mark), with or without the generation prompt."""

    def __call__(
        self,
        marks: Mapping[int, str],
        conversation: list[dict[str, Any]] = ...,
        generation: bool = ...,
    ) -> RenderedPrompt: ...


@dataclass(frozen=True, slots=True)
class _Headers:
    """How the template opens an assistant turn: for generation, and around a past turn's
    content (thinking templates differ: `<think>\n` against `<think>\n\n</think>\n\n`)."""

    generation: str
    history: str


def prompt_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def render_replaying(
    render: MarkedRender, messages: Sequence[Mapping[str, Any]], lookup: TurnLookup
) -> RenderedPrompt:
    """The prompt with every recognised tool turn as it was sampled, as far as the
    check allows; `render({})` is the template's own rendering."""
    turns = {
        i: found
        for i, m in enumerate(messages)
        if m.get("role") == "assistant" and m.get("tool_calls") and (found := lookup(m))
    }
    headers: _Headers | None = None
    for _ in range(_MAX_RENDERS):
        if not turns:
            break
        nonce = secrets.token_hex(8)
        marks = {i: f"KVSERVE-REPLAY-{nonce}-{i}-" for i in turns}
        try:
            rendered = render(marks)
        except TemplateError as exc:  # e.g. a template that insists on calls before results
            log.debug("tool turns not replayed: the template refused them: %s", exc)
            break
        if headers is None:
            headers = _headers(render)
        text, splices, failed = _splice(rendered.text, marks, turns, headers)
        if failed is None:
            return ReplayedPrompt(text, rendered.add_bos, splices)
        log.debug("tool turn at messages[%d] not replayed: the text before it is not the "
                  "prompt it was sampled after", failed)  # fmt: skip
        turns = {i: found for i, found in turns.items() if i < failed}
    return render({})


def _headers(render: MarkedRender) -> _Headers:
    """The template's assistant headers, from a probe conversation rendered with this
    request's options (tools, system prompt, template switches); empty where the probe
    does not show them (then only a turn framed like its generation prompt replays)."""
    probe = [{"role": "user", "content": "KVSERVE-PROBE"}]
    mark = "KVSERVE-PROBE-TURN-"
    try:
        base = render({}, probe, False).text
        opened = render({}, probe, True).text
        marked = render({1: mark}, [*probe, {"role": "assistant", "content": None,
                                             "tool_calls": []}], False).text  # fmt: skip
    except TemplateError:
        return _Headers("", "")
    head = marked[: marked.find(mark)] if mark in marked else ""
    if not (opened.startswith(base) and head.startswith(base)):
        return _Headers("", "")
    return _Headers(opened[len(base) :], head[len(base) :])


def _splice(
    text: str,
    marks: Mapping[int, str],
    turns: Mapping[int, Sequence[SampledTurn]],
    headers: _Headers,
) -> tuple[str, tuple[Splice, ...], int | None]:
    """`text` with each mark (in message order) replaced by the sampled turn whose prompt
    is the text before it, with the template's history header of an assistant turn read
    as its generation header where they differ; where they lie; and the first message
    whose mark found none (None: all did)."""
    splices: list[Splice] = []
    for i in sorted(marks):
        mark = marks[i]
        at = text.find(mark)
        if at < 0 or text.find(mark, at + 1) >= 0:
            return text, (), i  # the template dropped or repeated the content
        heads = [text[:at]]
        if headers.history != headers.generation and heads[0].endswith(headers.history):
            heads.append(heads[0][: at - len(headers.history)] + headers.generation)
        found = None
        for head in heads:
            digest = prompt_digest(head)
            match = next((t for t in turns[i] if t.prompt_digest == digest), None)
            if match is not None:
                found = head + match.text
                splices.append(Splice(len(head), len(found), match.token_ids))
                break
        if found is None:
            return text, (), i
        text = found + text[at + len(mark) :]
    return text, tuple(splices), None
