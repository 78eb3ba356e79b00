"""Chat templates: the GGUF's Jinja template rendered in a sandbox.

A chat template is untrusted input (it ships inside a model file), so it runs in
Jinja2's sandbox (see chat/jinja_env.py): no attribute access to Python internals, no
mutation of the objects passed in (it renders deep copies). A template that breaks
the rules fails at load or render with `TemplateError`, never with code execution.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from chat.jinja_env import make_environment

# Used when a model ships no template: ChatML, the most common format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The template could not be compiled or rendered."""


class TemplateRefusal(TemplateError):
    """The template itself rejected the conversation (its `raise_exception`)."""


def _raise_exception(message: str) -> None:
    # HF templates call raise_exception() to reject conversations they cannot format.
    raise TemplateRefusal(message)


def _null_content_as_empty(context: dict[str, Any]) -> dict[str, Any] | None:
    """Some templates use an assistant's content as a string even when the turn only
    calls tools (`'</think>' in content`), and a null content fails them. The client's
    null stays where a template handles it (`content is none` decides some layouts);
    where it fails, the content is "" (what llama.cpp substitutes, for the same templates)."""
    messages = context["messages"]
    if not any("content" in m and m["content"] is None for m in messages):
        return None
    out = [{**m, "content": ""} if "content" in m and m["content"] is None else m for m in messages]
    return {**context, "messages": out}


def _arguments_as_text(context: dict[str, Any]) -> dict[str, Any] | None:
    """Some templates write a call's arguments as a string (`'..' + arguments`)."""
    messages = context["messages"]
    if not any(m.get("tool_calls") for m in messages):
        return None
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_call_with_text_arguments(c) for c in calls]}
        out.append(m)
    return {**context, "messages": out}


def _call_with_text_arguments(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or isinstance(fn.get("arguments"), str):
        return call
    text = json.dumps(fn.get("arguments"), ensure_ascii=False)
    return {**call, "function": {**fn, "arguments": text}}


def _tools_as_list(context: dict[str, Any]) -> dict[str, Any] | None:
    """Some templates loop over `tools` without testing it (None is not iterable)."""
    return {**context, "tools": []} if context["tools"] is None else None


def _system_into_user(context: dict[str, Any]) -> dict[str, Any] | None:
    """Templates that refuse a system role: its text opens the first user turn."""
    messages = context["messages"]
    if not messages or messages[0].get("role") != "system":
        return None
    system, rest = str(messages[0].get("content") or ""), messages[1:]
    if rest and rest[0].get("role") == "user":
        first = rest[0]
        text = f"{system}\n\n{first.get('content') or ''}"
        return {**context, "messages": [{**first, "content": text}, *rest[1:]]}
    return {**context, "messages": [{"role": "user", "content": system}, *rest]}


# In order: the ones that change the least come first.
_ADAPTATIONS = (_null_content_as_empty, _arguments_as_text, _tools_as_list, _system_into_user)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    add_bos: bool  # whether the tokenizer should still add BOS


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str, add_bos: bool):
        env = make_environment(_raise_exception)
        self.source = source or CHATML
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        continue_final: bool = False,
    ) -> RenderedPrompt:
        """Render `messages`. `continue_final`: the last message is an assistant prefill
        that the model continues (no new turn, no end-of-turn after it)."""
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **(extra or {}),
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt and not continue_final,
            # Always defined: templates test `{% if tools %}`, which a strict undefined fails.
            "tools": tools or None,
        }
        text, context = self._render_adapting(context)
        if continue_final:
            text = self._cut_after_final(text, context, messages)
        # The template may write the BOS text itself; then the tokenizer must not add
        # another one, or the prompt would start with two.
        add_bos = self.add_bos and not (self.bos_token and text.startswith(self.bos_token))
        return RenderedPrompt(text, add_bos)

    def _cut_after_final(
        self, text: str, context: dict[str, Any], messages: Sequence[Mapping[str, Any]]
    ) -> str:
        prefill = str(messages[-1].get("content") or "")
        at = text.rfind(prefill) if prefill else -1
        if at >= 0:
            return text[: at + len(prefill)]
        # The template changed the text (or it is empty): open a fresh assistant turn
        # on the earlier messages and write the prefill after it.
        head = self._render(
            {**context, "messages": context["messages"][:-1], "add_generation_prompt": True}
        )
        return head + prefill

    def _render_adapting(self, context: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Render; when the template fails, render again with what some templates
        expect instead (as llama.cpp probes a template's capabilities), one
        adaptation more each time. Returns the text and the context that rendered."""
        first: TemplateError | None = None
        adaptations = iter(_ADAPTATIONS)
        while True:
            try:
                return self._render(context), context
            except TemplateError as exc:
                first = first or exc
                adapted = None
                for adapt in adaptations:
                    adapted = adapt(context)
                    if adapted is not None:
                        break
                if adapted is None:
                    raise first from None
                context = adapted

    def _render(self, context: dict[str, Any]) -> str:
        try:
            # Deep copies: the (mutable) sandbox lets a template change only its own data.
            return self._template.render(**copy.deepcopy(context))
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:  # includes SecurityError from the sandbox
            raise TemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # a template is code: any failure of it is a bad template
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
