"""Chat templates: the GGUF's Jinja template rendered in a sandbox.

A chat template is untrusted input (it ships inside a model file), so it runs in
Jinja2's `ImmutableSandboxedEnvironment`: no attribute access to Python internals, no
mutation of the objects passed in. A template that breaks the rules fails at load or
render with `TemplateError`, never with code execution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model ships no template: ChatML, the most common format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The template could not be compiled or rendered."""


def _raise_exception(message: str) -> None:
    # HF templates call raise_exception() to reject conversations they cannot format.
    raise TemplateError(message)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    add_bos: bool  # whether the tokenizer should still add BOS


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str, add_bos: bool):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )
        env.globals["raise_exception"] = _raise_exception
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
        text = self._render(context)
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

    def _render(self, context: dict[str, Any]) -> str:
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:  # includes SecurityError from the sandbox
            raise TemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # a template is code: any failure of it is a bad template
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
