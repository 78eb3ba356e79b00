"""Reasoning split: text between thinking tags goes to `reasoning_content`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chat.callstream import Delta

if TYPE_CHECKING:
    from chat.callformat import CallParser

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ThinkingSyntax:
    """How a format's thinking block opens and closes, as text: the engine counts the
    tokens between them and forces `close` when a thinking budget is spent
    (server/serving/thinking.py). The tags are llama.cpp's (each parser's
    thinking_start_tag and first thinking_end_tags entry, common/parsers/)."""

    open: str
    close: str

    def starts_inside(self, prompt: str) -> bool:
        """The template opens the block in the generation prompt (Qwen3, R1)."""
        return prompt.rstrip().endswith(self.open)


# gpt-oss's analysis channel (chat/harmony.py: the model writes the final channel's
# header itself after <|end|>), Command R7B's block (chat/formats_cohere.py), <think>.
HARMONY_THINKING = ThinkingSyntax("<|channel|>analysis<|message|>", "<|end|>")
COHERE_THINKING = ThinkingSyntax("<|START_THINKING|>", "<|END_THINKING|>")
GEMMA4_THINKING = ThinkingSyntax("<|channel>thought", "<channel|>")  # chat/formats_gemma.py
MINISTRAL_THINKING = ThinkingSyntax("[THINK]", "[/THINK]")  # chat/formats_mistral.py
MINIMAX_THINKING = ThinkingSyntax("<mm:think>", "</mm:think>")  # chat/formats_minimax.py
SEED_THINKING = ThinkingSyntax("<seed:think>", "</seed:think>")  # chat/formats_xml.py
# Apriel 1.6's prompt opens its thinking with a line of text; its answer follows a marker
APRIEL_THINKING = ThinkingSyntax("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]")
# Solar Open's thinking message: its prompt writes the header, the model the rest
SOLAR_THINKING = ThinkingSyntax("<|think|>", "<|end|>")  # chat/formats_solar.py
# Hy3's template writes its tokens as '<think{}>'.format(':opensource') (chat/formats_hy3.py)
HY3_THINKING = ThinkingSyntax("<think:opensource>", "</think:opensource>")
# Kimi K3's think section, its tags built by the template's open_tag/close_tag macros
KIMI_K3_THINKING = ThinkingSyntax("<|open|>think<|sep|>", "<|close|>think<|sep|>")
# Muse Glimmer's messages to `self` (chat/formats_muse.py)
MUSE_THINKING = ThinkingSyntax(" to=self<|message|>", "<|eom|>")
THINK = ThinkingSyntax(OPEN, CLOSE)


def thinking_syntax(template_source: str) -> ThinkingSyntax | None:
    """The thinking block a template's model writes, or None (it does not think)."""
    if "<|channel|>analysis" in template_source:
        return HARMONY_THINKING
    if COHERE_THINKING.open in template_source:
        return COHERE_THINKING
    if GEMMA4_THINKING.open in template_source:
        return GEMMA4_THINKING
    if MINISTRAL_THINKING.open in template_source and MINISTRAL_THINKING.close in template_source:
        return MINISTRAL_THINKING
    if MINIMAX_THINKING.open in template_source:
        return MINIMAX_THINKING
    if "'Here are my reasoning steps:\\n'" in template_source:  # Apriel 1.6
        return APRIEL_THINKING
    if '"<|begin|>assistant<|think|>"' in template_source:  # Solar Open
        return SOLAR_THINKING
    if SEED_THINKING.open in template_source:  # its template also names </think>
        return SEED_THINKING
    if "'<think{}>'" in template_source and "':opensource'" in template_source:
        return HY3_THINKING
    if "to=self<|message|>" in template_source and MUSE_THINKING.close in template_source:
        return MUSE_THINKING
    if "open_tag('think')" in template_source and "<|sep|>" in template_source:
        return KIMI_K3_THINKING  # chat/formats_kimi3.py
    if OPEN in template_source and CLOSE in template_source:
        return THINK
    return None


def has_thinking(template_source: str) -> bool:
    """`<think>` tags, or a format's own thinking blocks that its call parser splits:
    gpt-oss's analysis channel (chat/harmony.py), Command R7B's thinking block
    (chat/formats_cohere.py), Gemma 4's thought channel (chat/formats_gemma.py),
    Ministral 3's `[THINK]` block (chat/formats_mistral.py), MiniMax-M3's `<mm:think>`
    (chat/formats_minimax.py), Seed-OSS's `<seed:think>` (chat/formats_xml.py)."""
    return thinking_syntax(template_source) is not None


def starts_inside(prompt: str) -> bool:
    """Templates that open the thinking block in the generation prompt (Qwen3, R1)."""
    return THINK.starts_inside(prompt)


class ReasoningSplitter:
    """Incremental: holds back a possible partial tag until it resolves. `syntax`: the
    tags (`<think>`, or a format's own: Seed-OSS's `<seed:think>`)."""

    def __init__(self, inside: bool = False, syntax: ThinkingSyntax = THINK):
        self._open, self._close = syntax.open, syntax.close
        self._inside = inside
        self._buf = ""
        self._after_close = False  # drop the blank lines between thinking and answer

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while True:
            if self._after_close:
                self._buf = self._buf.lstrip("\n")
                self._after_close = not self._buf
            tag = self._close if self._inside else self._open
            kind = "reasoning" if self._inside else "content"
            at = self._buf.find(tag)
            if at < 0:
                keep = next(
                    (k for k in range(min(len(tag) - 1, len(self._buf)), 0, -1)
                     if tag.startswith(self._buf[-k:])),
                    0,
                )  # fmt: skip
                cut = len(self._buf) - keep
                if cut:
                    out.append(Delta(kind, self._buf[:cut]))  # type: ignore[arg-type]
                self._buf = self._buf[cut:]
                return out
            if at:
                out.append(Delta(kind, self._buf[:at]))  # type: ignore[arg-type]
            self._buf = self._buf[at + len(tag) :]
            self._after_close = self._inside
            self._inside = not self._inside

    def finish(self) -> list[Delta]:
        out = []
        if self._buf:
            out.append(Delta("reasoning" if self._inside else "content", self._buf))
        self._buf = ""
        return out


class ThinkingThenCalls:
    """A call parser behind its format's own thinking split (Seed-OSS's `<seed:think>`):
    the reasoning passes, the content goes on to the calls parser."""

    def __init__(self, syntax: ThinkingSyntax, calls: CallParser):
        self._split = ReasoningSplitter(False, syntax)
        self._calls = calls
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        return self._route(self._split.feed(text))

    def finish(self) -> list[Delta]:
        out = self._route(self._split.finish()) + self._calls.finish()
        self.num_calls = self._calls.num_calls
        return out

    def _route(self, deltas: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for d in deltas:
            out += self._calls.feed(d.text) if d.kind == "content" else [d]
        self.num_calls = self._calls.num_calls
        return out


# Effort levels every API spells (OpenAI's reasoning_effort / reasoning.effort, Anthropic's
# output_config.effort, Ollama's think levels). "none" and "minimal" turn thinking off.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def effort_kwargs(effort: str | None) -> dict[str, object]:
    """The template variables a reasoning effort sets: `enable_thinking` (Qwen 3,
    DeepSeek, Granite and the other templates with a thinking switch) and
    `reasoning_effort` (gpt-oss's `Reasoning: low|medium|high`). A template that reads
    neither renders as before, so on a model without thinking the effort is a no-op.
    Unknown levels are the caller's 400; None sets nothing."""
    if effort is None:
        return {}
    if effort in ("none", "minimal"):
        return {"enable_thinking": False}
    level = {"xhigh": "high", "max": "high"}.get(effort, effort)
    return {"enable_thinking": True, "reasoning_effort": level}


# Ollama's `think`: true/false, or one of its levels.
OLLAMA_THINK_LEVELS = ("low", "medium", "high")


def think_kwargs(think: bool | str) -> dict[str, object]:
    """The template variables Ollama's `think` sets: the switch, or a level as an effort."""
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return effort_kwargs(think)
