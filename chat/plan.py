"""A chat request -> prompt text, grammar and an output parser (the server wires these).

Messages arrive as plain dicts in OpenAI's shape (content already joined to a string;
`tool_calls[i].function.arguments` a JSON string).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from chat.call_ids import demands_nine, with_nine
from chat.callformat import CallFormat, CallParser, PromptBound, TurnAdapter
from chat.callstream import Delta
from chat.content import with_media_markers
from chat.formats import GrammarSpec, detect_format, generic_history, tool_system_prompt
from chat.reasoning import THINK, ReasoningSplitter, ThinkingSyntax, thinking_syntax
from chat.replay import TurnLookup, render_replaying
from chat.schema import SchemaError, check_schema, json_object_gbnf, schema_to_gbnf
from chat.template import ChatTemplate, RenderedPrompt, TemplateError, TemplateRefusal
from chat.tools import ChatInputError, Tool, ToolChoice, check_tools, parse_arguments

log = logging.getLogger("kvserve.chat")


@dataclass(frozen=True, slots=True)
class ChatOptions:
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice("auto")
    parallel_tool_calls: bool = True
    response_format: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: Any = None
    reasoning_format: Literal["auto", "none"] = "auto"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # The choice the prompt describes, when it differs from the one the grammar enforces:
    # an agentic loop keeps one prompt head over its rounds (so each round continues on
    # the last one's KV) while forcing a call in one round and forbidding it in another.
    prompt_choice: ToolChoice | None = None
    # llama-server's add_generation_prompt (/apply-template, /tokenize): False renders the
    # conversation without the assistant turn's opening (an assistant prefill continues
    # its message whatever this says).
    add_generation_prompt: bool = True
    # What marks an image's place in the prompt text (the engine's `media_marker`; "":
    # the model takes no images, and a message with an image part is refused).
    media_marker: str = ""


class OutputParser:
    """Generated text -> content / reasoning / tool-call deltas, incrementally. Feeding
    the text whole or one character at a time gives the same calls and text.

    A call is released only once its arguments are complete: from its start on, the
    output is held back until the call closes. A call cut off by the end of the output
    (max_tokens) is therefore never reported; `num_truncated` counts it, and its text is
    dropped (a fragment of JSON is neither content nor a call)."""

    def __init__(self, reasoning: ReasoningSplitter | None, tools: CallParser | None):
        self._reasoning = reasoning
        self._tools = tools
        self._held: list[Delta] = []
        self.num_truncated = 0

    def feed(self, text: str) -> list[Delta]:
        return self._route(
            self._reasoning.feed(text) if self._reasoning else [Delta("content", text)]
        )

    def finish(self) -> list[Delta]:
        deltas = self._route(self._reasoning.finish()) if self._reasoning else []
        if self._tools is None:
            return deltas
        tail = self._held + self._tools.finish()
        self._held = []
        complete = self._tools.num_calls
        cut = {d.index for d in tail if d.kind in ("start", "args") and d.index >= complete}
        self.num_truncated = len(cut)
        return deltas + [d for d in tail if d.kind not in ("start", "args") or d.index < complete]

    def _route(self, deltas: list[Delta]) -> list[Delta]:
        out = []
        for delta in deltas:
            if delta.kind == "content" and self._tools is not None:
                out += self._release(self._tools.feed(delta.text))
            elif delta.text:
                out.append(delta)
        return out

    def _release(self, deltas: list[Delta]) -> list[Delta]:
        """Hold output from an open call's start on, until that call is complete."""
        assert self._tools is not None
        self._held += deltas
        complete = self._tools.num_calls
        if any(d.kind in ("start", "args") and d.index >= complete for d in self._held):
            return []
        out, self._held = self._held, []
        return out

    @property
    def num_calls(self) -> int:
        return self._tools.num_calls if self._tools else 0


@dataclass(frozen=True, slots=True)
class ChatPlan:
    prompt: RenderedPrompt
    grammar: GrammarSpec | None
    # Set when tools are offered, or when the format's parser also splits the reasoning
    # (gpt-oss's channels: its output needs that parser even without tools).
    tool_format: CallFormat | None
    split_reasoning: bool
    reasoning_inside: bool
    tools: tuple[Tool, ...] = ()  # the offered ones (a parser types XML values by them)
    # The images of the prompt, in the order of their markers in its text (what each
    # message's image part carried: opaque here, the server's read image).
    media: tuple[Any, ...] = ()
    thinking: ThinkingSyntax = THINK  # the template's thinking tags (Hy3's are its own)

    def parser(self) -> OutputParser:
        fmt = self.tool_format
        own = fmt is not None and fmt.owns_reasoning
        splitter = self.split_reasoning and not own
        reasoning = ReasoningSplitter(self.reasoning_inside, self.thinking) if splitter else None
        tools = fmt.parser(self.tools, self.split_reasoning) if fmt else None
        return OutputParser(reasoning, tools)


def plan_chat(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    opts: ChatOptions,
    replay: TurnLookup | None = None,
) -> ChatPlan:
    """`replay`: the sampled text of past tool turns, which render as they were sampled
    where that keeps the prompt the model saw (chat/replay.py). A template that refuses
    a system message past the head (Gemma's, Mistral's, Qwen 3.5's: 6 of llama.cpp's 70)
    gets it folded into a user turn (`fold_late_system`) instead of a 400: Claude Code
    sends its environment block so, on every request. Whether to fold is the template's
    answer to a probe, never the conversation's, so that turn 1 (which such a template
    may still render) and turn 2 (which it refuses) share their head.

    A message's content may be a list of parts: text parts and image parts
    (`{"type": "image", "image": ..., "param": ...}`); it renders as its text with
    `opts.media_marker` in each image's place (`with_media_markers`)."""
    messages, media = with_media_markers(messages, opts.media_marker)
    if refuses_late_system(template):
        folded = fold_late_system(messages)
        if folded is not None:
            log.debug("folded a system message past the head into a user turn")
            messages = folded
    plan = _plan_chat(template, messages, opts, replay)
    return replace(plan, media=media) if media else plan


_LATE_SYSTEM_PROBE = [
    {"role": "user", "content": "a"},
    {"role": "system", "content": "b"},
    {"role": "assistant", "content": "c"},
    {"role": "user", "content": "d"},
]
_late_system_refused: dict[str, bool] = {}  # template source -> refused the probe


def refuses_late_system(template: ChatTemplate) -> bool:
    """Whether the template refuses a system message between turns (memoized)."""
    refused = _late_system_refused.get(template.source)
    if refused is None:
        try:
            template.render(_LATE_SYSTEM_PROBE, add_generation_prompt=True)
            refused = False
        except TemplateRefusal:
            refused = True
        except TemplateError:
            refused = False  # a template that fails otherwise fails the request as before
        if len(_late_system_refused) >= 256:  # bounded: templates come from config and GGUFs
            _late_system_refused.clear()
        _late_system_refused[template.source] = refused
    return refused


def fold_late_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The conversation with each system message after the leading ones joined to the
    user turn before it (or, with none before it, after it), so a turn's text and the
    prompt's head stay what they were when the next turn comes; None if there is none
    to fold or a text is not a string."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    late = [i for i in range(head, len(messages)) if messages[i]["role"] == "system"]
    if not late or any(not isinstance(messages[i].get("content"), str) for i in late):
        return None
    out = [dict(m) for m in messages]
    for i in late:
        users = [j for j in range(i - 1, head - 1, -1) if out[j]["role"] == "user"]
        users = users[:1] or [j for j in range(i + 1, len(out)) if out[j]["role"] == "user"][:1]
        if not users or not isinstance(out[users[0]].get("content"), str):
            return None
        j = users[0]
        text = out[i]["content"]
        out[j]["content"] = (f"{out[j]['content']}\n\n{text}" if j < i
                             else f"{text}\n\n{out[j]['content']}")  # fmt: skip
    return [m for i, m in enumerate(out) if i not in set(late)]


def _plan_chat(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    opts: ChatOptions,
    replay: TurnLookup | None,
) -> ChatPlan:
    fmt = detect_format(template.source)
    offered = check_tools(list(opts.tools), opts.tool_choice)
    described_choice = opts.prompt_choice or opts.tool_choice
    described = offered if opts.prompt_choice is None else list(opts.tools)
    # "none" keeps a native template's tools, as llama.cpp does (the head other turns'
    # KV has); the generic envelope's system prompt teaches calling, so it goes.
    described = [] if described_choice.mode == "none" and not fmt.native else described
    offered = [] if opts.tool_choice.mode == "none" else offered
    tools_var = None
    system_prompt = None
    if described and fmt.native:
        tools_var = [t.as_openai() for t in described]
    elif described:
        system_prompt = tool_system_prompt(described, described_choice, opts.parallel_tool_calls)
    continue_final = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")

    def render(
        marks: Mapping[int, str],
        conversation: list[dict[str, Any]] = messages,
        generation: bool = opts.add_generation_prompt,
    ) -> RenderedPrompt:
        rendered_messages = _history(conversation, fmt, marks)
        if demands_nine(template.source):
            rendered_messages = with_nine(rendered_messages)
        if isinstance(fmt, TurnAdapter):
            rendered_messages = fmt.adapt_messages(template.source, rendered_messages)
        if system_prompt is not None:
            rendered_messages = _with_system(rendered_messages, system_prompt)
        final = continue_final and conversation is messages
        prompt = template.render(
            rendered_messages,
            add_generation_prompt=generation,
            extra=opts.template_kwargs,
            tools=tools_var,
            continue_final=final,
        )
        if isinstance(fmt, TurnAdapter):
            text = fmt.adapt_prompt(prompt.text, generation and not final)
            prompt = RenderedPrompt(text, prompt.add_bos)
        return prompt

    prompt_text = render({}) if replay is None else render_replaying(render, messages, replay)
    grammar = None
    # the format as it reads the turn after this prompt: its grammar, and its parser
    # (Kimi K3's starts in whichever section the prompt opened)
    calls = fmt.for_prompt(prompt_text.text) if isinstance(fmt, PromptBound) else fmt
    if offered:
        grammar = calls.grammar(offered, opts.tool_choice, opts.parallel_tool_calls,
                                _document(opts))  # fmt: skip
    elif opts.response_format == "json_object":
        grammar = GrammarSpec(json_object_gbnf())
    elif opts.response_format == "json_schema":
        try:
            grammar = GrammarSpec(schema_to_gbnf(opts.json_schema))
        except SchemaError as exc:
            raise ChatInputError(str(exc), param="response_format.json_schema.schema") from None
    thinking = thinking_syntax(template.source)
    split = opts.reasoning_format != "none" and thinking is not None
    return ChatPlan(
        prompt_text,
        grammar,
        calls if offered or fmt.owns_reasoning else None,
        split,
        split and (thinking or THINK).starts_inside(prompt_text.text),
        tuple(offered),
        thinking=thinking or THINK,
    )


def _document(opts: ChatOptions) -> Any:
    """The schema a final answer must match beside tool calls (None: free text)."""
    if opts.response_format == "json_object":
        return {"type": "object"}
    if opts.response_format == "json_schema":
        try:
            check_schema(opts.json_schema)
        except SchemaError as exc:
            raise ChatInputError(str(exc), param="response_format.json_schema.schema") from None
        return opts.json_schema
    return None


def _history(
    messages: list[dict[str, Any]], fmt: CallFormat, marks: Mapping[int, str]
) -> list[dict[str, Any]]:
    """Check tool history and put it in the form the template (or format) expects.
    `marks`: assistant turns (by index) rendered as this text alone, without their calls
    (chat/replay.py puts the text they were sampled as in its place)."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        if i in marks:
            names.update((call["id"], call["function"]["name"]) for call in message["tool_calls"])
            out.append({"role": "assistant", "content": marks[i]})
        elif role == "assistant" and message.get("tool_calls"):
            calls = []
            for j, call in enumerate(message["tool_calls"]):
                where = f"messages[{i}].tool_calls[{j}]"
                fn = call["function"]
                args = _history_arguments(fn["arguments"], f"{where}.function.arguments")
                names[call["id"]] = fn["name"]
                calls.append({**call, "function": {"name": fn["name"], "arguments": args}})
            item = {**message, "tool_calls": calls}
            out.append(item if fmt.native else generic_history(item))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                raise ChatInputError("a tool message needs 'tool_call_id'",
                                     param=f"messages[{i}].tool_call_id")  # fmt: skip
            name = names.get(call_id, message.get("name") or "")
            if fmt.native:
                out.append({**message, "name": name})
            else:
                out.append(_generic_tool_result(out, name, message.get("content") or ""))
        else:
            out.append(message)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


def _history_arguments(text: str, param: str) -> Any:
    """A past call's arguments as a JSON value. A call cut off by max_tokens (from a
    server that returned it, or an older kvserve) has arguments that are empty or not
    JSON: they are kept as the text they are, so that sending such history back does
    not break the conversation (the template renders them as a string)."""
    if not text.strip():
        return {}
    try:
        return parse_arguments(text, param)
    except ChatInputError:
        if _is_json_prefix(text):
            return text
        raise


# What may complete a cut-off JSON text before its open brackets are closed.
_COMPLETIONS = ("", "null", ":null", "0", '"', '":null', "rue", "ue", "e", "alse", "lse",
                "se", "ull", "ll", "l")  # fmt: skip


def _is_json_prefix(text: str) -> bool:
    """Whether `text` is the beginning of some JSON document (a cut-off call's arguments),
    as opposed to text that no continuation makes valid."""
    stack: list[str] = []
    in_string = escape = False
    for ch in text:
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}" and (not stack or stack.pop() != ch):
            return False
    head = text.rstrip()
    head = head[:-1] if head.endswith(",") and not in_string else head
    closers = "".join(reversed(stack))
    for more in _COMPLETIONS:
        if in_string != more.startswith('"'):
            continue
        try:
            json.loads(head + more + closers)
            return True
        except ValueError:
            continue
    return False


def _generic_tool_result(out: list[dict[str, Any]], name: str, content: str) -> dict[str, Any]:
    """Tool results as a user turn (templates without tool support may reject a 'tool'
    role); consecutive results share one turn, so user/assistant still alternate."""
    text = json.dumps({"tool_response": {"name": name, "content": content}}, ensure_ascii=False)
    if out and out[-1].get("_tool_results"):  # a marker, removed before rendering
        previous = out.pop()
        text = previous["content"] + "\n" + text
    return {"role": "user", "content": text, "_tool_results": True}


def _with_system(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{prompt}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
