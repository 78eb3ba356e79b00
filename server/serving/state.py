"""One choice's state: what it has produced so far and how its output is being parsed.

`ParsedOutput` is the one accumulator of parsed output (the text, the reasoning and the
tool calls a parser has produced so far) that every API reads its answer from instead of
re-assembling `Delta`s by hand: a plain request feeds everything at once and reads the
totals; a stream feeds each increment and reads the call whose arguments it has to close.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chat.callstream import Delta
from chat.plan import OutputParser
from engine.client import FinishReason, SeqOutput, Timings, TokenLogprob


@dataclass(slots=True)
class Choice:
    """One sequence's accumulated result (or one increment of it, see `drive.merged`)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    num_reasoning_tokens: int = 0  # of the output, inside thinking blocks (the engine counts)
    error: str | None = None
    stop_sequence: str = ""
    timings: Timings | None = None  # the engine's stage times, with the finish
    finished_at: float = 0.0  # time.monotonic() when the finish arrived here
    written: bool = False  # a stream's lane sent its text already (server/serving/wire.py)

    def add(self, out: SeqOutput) -> None:
        self.written = out.written
        if out.text:
            self.text.append(out.text)
        self.token_ids.extend(out.token_ids)
        self.logprobs.extend(out.logprobs)
        self.prompt_logprobs.extend(out.prompt_logprobs)
        if out.num_prompt_tokens:  # the prompt's split, known before its prefill
            self.num_prompt_tokens = out.num_prompt_tokens
            self.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.num_prompt_tokens = out.num_prompt_tokens
            self.num_cached_tokens = out.num_cached_tokens
            self.num_output_tokens = out.num_output_tokens
            self.num_reasoning_tokens = out.num_reasoning_tokens
            self.error = out.error
            self.stop_sequence = out.stop_sequence
            self.timings = out.timings
            self.finished_at = time.monotonic()


@dataclass(slots=True)
class Step:
    """What one increment of one choice means: parsed pieces (calls only once their
    arguments are complete), the token logprobs behind them, and maybe the finish."""

    index: int
    deltas: list[Delta]
    logprobs: list[TokenLogprob]
    finish: FinishReason | None
    num_calls: int
    token_ids: list[int] = field(default_factory=list)  # sampled in this increment
    written: bool = False  # its text is out already (the stream's lane): send nothing


@dataclass(slots=True)
class ChoiceState:
    """A chat choice being streamed (or parsed whole): its parser, its totals (the
    prompt's split as soon as the engine knows it, the rest with the finish), the
    logprob text offset (for completions' legacy logprobs), and everything it produced:
    the text (and ids) as sampled and the parsed output. `on_finish` sees the state once the
    choice has finished (server/serving/replay.py records tool turns there)."""

    index: int
    parser: OutputParser
    total: Choice = field(default_factory=Choice)
    offset: int = 0
    on_finish: Callable[[ChoiceState], None] | None = None
    sampled: list[str] = field(default_factory=list)
    sampled_ids: list[int] = field(default_factory=list)  # the ids behind `sampled`
    output: ParsedOutput = field(default_factory=lambda: ParsedOutput())

    def advance(self, inc: Choice) -> Step:
        text = "".join(inc.text)
        self.sampled.append(text)
        self.sampled_ids.extend(inc.token_ids)
        pieces = self.parser.feed(text)
        if inc.num_prompt_tokens and inc.finish_reason is None:  # known before the finish
            self.total.num_prompt_tokens = inc.num_prompt_tokens
            self.total.num_cached_tokens = inc.num_cached_tokens
        if inc.finish_reason is not None:
            self.total = inc  # the counts come with the finish
            pieces += self.parser.finish()
        self.output.add(pieces)
        if inc.finish_reason is not None and self.on_finish is not None:
            self.on_finish(self)
        return Step(self.index, pieces, inc.logprobs, inc.finish_reason, self.parser.num_calls,
                    inc.token_ids, inc.written)  # fmt: skip


def coalesced(deltas: list[Delta]) -> list[Delta]:
    """Adjacent pieces of the same kind (and call) as one: fewer, larger stream events."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last is not None and d.kind != "start" and (last.kind, last.index) == (d.kind, d.index):
            out[-1] = Delta(d.kind, last.text + d.text, d.index, last.call_id)
        else:
            out.append(d)
    return out


def usage(choices: list[Choice], num_prompt_tokens: int) -> dict[str, Any]:
    """OpenAI usage: the prompt counted once, completion tokens summed over choices."""
    completion = sum(c.num_output_tokens for c in choices)
    cached = min((c.num_cached_tokens for c in choices), default=0)
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": num_prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        # Counted by the engine as generated (engine/thinking.py), tags included: 0 on
        # a template without a thinking block.
        "completion_tokens_details": {
            "reasoning_tokens": sum(c.num_reasoning_tokens for c in choices)
        },
    }


def finish_reason_text(reason: FinishReason | None) -> str | None:
    if reason is None or reason is FinishReason.ABORT:
        return None
    return reason.value


def chat_finish_text(reason: FinishReason | None, num_calls: int) -> str | None:
    """OpenAI chat's finish_reason: a natural end with calls is 'tool_calls'."""
    if reason is FinishReason.STOP and num_calls:
        return "tool_calls"
    return finish_reason_text(reason)


@dataclass(slots=True)
class ParsedCall:
    """One tool call: `index` is its place among the choice's calls (the parser's)."""

    index: int
    call_id: str
    name: str
    # Tool-call arguments are one type from a protocol to the template and back: JSON
    # text, as generated. The model samples text and a stream sends it in fragments; the
    # OpenAI wires (chat, Responses) carry text; a call cut off by max_tokens is no valid
    # JSON yet must go back into the history as it was; the replay memory keys turns by
    # it (server/serving/replay.py). An API whose wire has an object (Ollama's arguments,
    # Anthropic's tool_use input, an MCP call) converts at its own edge, once each way,
    # and the chat layer parses the history's text once, for the template
    # (chat/plan.py), which needs the value.
    arguments: str = ""


@dataclass(slots=True)
class ParsedOutput:
    """What one choice said: content, reasoning and calls in the order they started."""

    _content: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _calls: dict[int, ParsedCall] = field(default_factory=dict)

    def add(self, deltas: list[Delta]) -> None:
        for d in deltas:
            if d.kind == "content":
                self._content.append(d.text)
            elif d.kind == "reasoning":
                self._reasoning.append(d.text)
            elif d.kind == "start":
                self._calls[d.index] = ParsedCall(d.index, d.call_id, d.text)
            elif d.index in self._calls:  # a parser starts a call before its arguments
                self._calls[d.index].arguments += d.text

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def calls(self) -> list[ParsedCall]:
        return list(self._calls.values())

    def call(self, index: int) -> ParsedCall:
        return self._calls[index]


def parsed(deltas: list[Delta]) -> ParsedOutput:
    """The accumulator fed with `deltas` at once (a plain request's whole output)."""
    out = ParsedOutput()
    out.add(deltas)
    return out


def openai_calls(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    """Calls in OpenAI chat's `tool_calls` shape (chat completions and its MCP turn)."""
    return [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]  # fmt: skip
