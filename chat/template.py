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
    ) -> RenderedPrompt:
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **(extra or {}),
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            text = self._template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:  # includes SecurityError from the sandbox
            raise TemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # a template is code: any failure of it is a bad template
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        # The template may write the BOS text itself; then the tokenizer must not add
        # another one, or the prompt would start with two.
        add_bos = self.add_bos and not (self.bos_token and text.startswith(self.bos_token))
        return RenderedPrompt(text, add_bos)
