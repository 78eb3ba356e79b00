"""Tool-call formats: how a model family writes calls, the grammar that forces valid
ones, and the incremental parser that turns its output back into calls.

- Hermes / Qwen: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, anywhere.
- Llama 3.x: a bare `{"name": .., "parameters": {..}}` answer (after `<|python_tag|>`);
  Llama 3.2's template (no `<|python_tag|>`) asks for one such call and refuses more.
- Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`.
- Granite 3.3: `<|tool_call|>[{"name": .., "arguments": {..}}, ..]` (chat/formats_granite.py).
- The same objects in other wrappers, as llama.cpp's autoparser derives them from their
  templates: Nemotron Nano v2's `<TOOLCALL>[..]</TOOLCALL>` (after `<think>`, which the
  prompt opens), Apriel 1.6's `<tool_calls>[..]</tool_calls>` after its thinking,
  MiniMax-M1's `<tool_calls>` lines, FireFunction v2's ` functools[..]`.
- Generic: for templates without tool support, the tools are described in the system
  prompt and a call is the envelope `{"tool_calls": [{"name": .., "arguments": {..}}]}`
  as the whole answer. In `auto` mode the lazy grammar arms when the answer starts with
  `{"tool_calls"`; any other answer stays free text (a plain JSON answer included).

Other families live beside this module, each in its chat/formats_*.py (and gpt-oss's
channels in chat/harmony.py; docs/development.md's module map lists them); `detect_format`
chooses among them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chat.callformat import (
    CallFormat,
    GrammarSpec,
    MemoizedGrammar,
    document_rule,
    json_arguments,
    keyed_tools,
    starts_at,
    thinking_block,
)
from chat.callstream import CallScanner, Delta, held_back
from chat.formats_apertus import detect_apertus
from chat.formats_cohere import detect_cohere
from chat.formats_command_r import detect_command_r
from chat.formats_deepseek_dsml import detect_dsml
from chat.formats_functionary import detect_functionary
from chat.formats_gemma import detect_gemma
from chat.formats_glm import detect_glm
from chat.formats_granite import calls_as_content, detect_granite
from chat.formats_hy3 import detect_hy3
from chat.formats_kimi3 import detect_kimi3
from chat.formats_lfm2 import detect_lfm2
from chat.formats_minicpm5 import detect_minicpm5
from chat.formats_minimax import detect_minimax
from chat.formats_minimax2 import detect_minimax2
from chat.formats_mistral import detect_ministral
from chat.formats_muse import detect_muse
from chat.formats_sections import detect_sections
from chat.formats_solar import detect_solar
from chat.formats_xml import detect_xml
from chat.gbnf import RuleSet, literal
from chat.harmony import HARMONY
from chat.reasoning import APRIEL_THINKING, THINK, ThinkingSyntax
from chat.tools import Tool, ToolChoice

__all__ = ["FIREFUNCTION_V2", "GENERIC", "GRANITE", "HERMES", "LLAMA3", "LLAMA3_2", "MINIMAX_M1",
           "MISTRAL", "NEMOTRON_V2", "CallFormat", "GrammarSpec", "ToolFormat", "ToolParser",
           "detect_format", "generic_history", "tool_system_prompt"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ToolFormat(MemoizedGrammar):
    name: str
    native: bool  # the template renders `tools` and `tool_calls` itself
    marker: str | None  # a call region starts at this text, anywhere in the output
    opener: tuple[str, ...]  # or: at the start, these pieces with optional whitespace
    consume_opener: bool  # False: the opener is the start of the first call object
    args_key: str
    prefix: str  # grammar text before the calls
    separator: str  # grammar text between calls
    suffix: str  # grammar text after the calls
    trigger: str  # lazy trigger regex (std::regex ECMAScript, whole-output match)
    trigger_word: str = ""
    owns_reasoning: bool = False  # `<think>` (if any) is split before the calls
    single_call: bool = False  # the template renders one call a turn (Llama 3.2 raises)
    # the model's thinking block (`<think>`, Apriel's): a forced grammar lets it come first
    think: ThinkingSyntax | None = None
    opened: bool = False  # set by for_prompt: the prompt opened the thinking, which must close

    def for_prompt(self, prompt: str) -> ToolFormat:
        """A thinking format's grammar for a prompt that opened its thinking: the block must
        close before a forced call, or the `<think>` split would read the call as
        reasoning (a PromptBound format)."""
        if self.think is None or not self.think.starts_inside(prompt):
            return self
        return replace(self, opened=True)

    def bound_to(self) -> str:
        return str(self.opened)

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel and not self.single_call, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> ToolParser:
        """The JSON families need neither: a call names itself and carries JSON."""
        return ToolParser(self)


HERMES = ToolFormat(
    "hermes", True, "<tool_call>", (), True, "arguments",
    '"<tool_call>" ws', 'ws "</tool_call>" ws "<tool_call>" ws', 'ws "</tool_call>"',
    starts_at("<tool_call>"),
)  # fmt: skip
LLAMA3 = ToolFormat(
    "llama3", True, None, ("{", '"name"'), False, "parameters",
    '("<|python_tag|>")? ws', 'ws ";" ws', "",
    r'(?:<\|python_tag\|>)?\s*(\{\s*"name")[\s\S]*', "<|python_tag|>",
)  # fmt: skip
LLAMA3_2 = ToolFormat(
    "llama3.2", True, None, ("{", '"name"'), False, "parameters", "ws", "", "",
    r'\s*(\{\s*"name")[\s\S]*', single_call=True,
)  # fmt: skip
NEMOTRON_V2 = ToolFormat(
    "nemotron-v2", True, "<TOOLCALL>", (), True, "arguments",
    '"<TOOLCALL>[" ws', 'ws "," ws', 'ws "]</TOOLCALL>"',
    starts_at("<TOOLCALL>"), "<TOOLCALL>", think=THINK,
)  # fmt: skip
# Apriel 1.6: its prompt opens the thinking, `[BEGIN FINAL RESPONSE]` ends it
APRIEL = ToolFormat(
    "apriel-1.6", True, "<tool_calls>", (), True, "arguments",
    '"<tool_calls>[" ws', 'ws "," ws', 'ws "]</tool_calls>"',
    starts_at("<tool_calls>"), think=APRIEL_THINKING,
)  # fmt: skip
MINIMAX_M1 = ToolFormat(
    "minimax-m1", True, "<tool_calls>", (), True, "arguments",
    '"<tool_calls>\\n"', '"\\n"', '"\\n</tool_calls>"',
    starts_at("<tool_calls>"),
)  # fmt: skip
FIREFUNCTION_V2 = ToolFormat(
    "firefunction-v2", True, "functools[", (), True, "arguments",
    '"functools[" ws', 'ws "," ws', 'ws "]"',
    starts_at("functools["),
)  # fmt: skip
MISTRAL = ToolFormat(
    "mistral", True, "[TOOL_CALLS]", (), True, "arguments",
    '"[TOOL_CALLS]" ws "[" ws', 'ws "," ws', 'ws "]"',
    starts_at("[TOOL_CALLS]"), "[TOOL_CALLS]",
)  # fmt: skip


# GigaChat 3 (llama.cpp's gigachat-v3 handler) writes its one call a turn as a message of
# the `function call` role; GigaChat 3.1 (its autoparser) after `<|function_call|>`.
GIGACHAT3 = ToolFormat(
    "gigachat3", True, "<|message_sep|>\n\nfunction call<|role_sep|>\n", (), True, "arguments",
    '"<|message_sep|>\\n\\nfunction call<|role_sep|>\\n"', "", "",
    r"[\s\S]*?(<\|message_sep\|>\n\nfunction call<\|role_sep\|>\n)[\s\S]*", single_call=True,
)  # fmt: skip
GIGACHAT3_1 = ToolFormat(
    "gigachat3.1", True, "<|function_call|>", (), True, "arguments", '"<|function_call|>"', "",
    "", starts_at("<|function_call|>"), "<|function_call|>", single_call=True,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class GraniteFormat(ToolFormat):
    """Granite 3.3 (chat/formats_granite.py): its template renders no past call, so the
    calls are written into the turn's content (a `TurnAdapter`)."""

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return calls_as_content(messages)

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text


GRANITE = GraniteFormat(
    "granite", True, "<|tool_call|>", (), True, "arguments",
    '"<|tool_call|>" ws "[" ws', 'ws "," ws', 'ws "]"',
    starts_at("<|tool_call|>"), "<|tool_call|>",
)  # fmt: skip
GENERIC = ToolFormat(
    "generic", False, None, ("{", '"tool_calls"', ":", "["), True, "arguments",
    '"{" ws "\\"tool_calls\\"" ws ":" ws "[" ws', 'ws "," ws', 'ws "]" ws "}"',
    r'\s*(\{\s*"tool_calls")[\s\S]*',
)  # fmt: skip


# The families with modules of their own, asked in this order after Ministral 3 and
# harmony (llama.cpp's order where it has a rule for them; their markers are disjoint).
_DETECTORS: tuple[Callable[[str], CallFormat | None], ...] = (
    detect_gemma,  # Gemma 4's `<|tool_call>call:`
    detect_minimax,  # MiniMax-M3's namespaced `<invoke>`s
    detect_dsml,  # DeepSeek V3.2 / V4's DSML `<invoke>`s
    detect_minimax2,  # MiniMax-M2's `<minimax:tool_call>`
    detect_lfm2,  # LFM2's Python-style call list
    detect_muse,  # Muse Glimmer's `to=` messages, ATEM blocks
    detect_functionary,  # Functionary v3.2's `>>>NAME` recipients
    detect_kimi3,  # `<|open|>` / `<|close|>` sections
    detect_minicpm5,  # `<function name=` with `<param name=`
    detect_xml,  # Qwen3-Coder's XML (Seed-OSS's too)
    detect_sections,  # DeepSeek V3.1 / R1, Kimi K2
    detect_glm,  # <tool_call> with <arg_key> tags, before Hermes
    detect_hy3,  # GLM's tags as Hy3's own `:opensource` tokens
    detect_apertus,  # `{"NAME": {..}}` in <|tools_prefix|>
    detect_cohere,  # Command R7B's action blocks
    detect_command_r,  # Command R+'s fenced `Action:` list
    detect_solar,  # Solar Open's `<|tool_calls|>` messages
)


def detect_format(template_source: str) -> CallFormat:
    """The family a template belongs to, from what its text mentions (the order is
    llama.cpp's, common/chat.cpp: Ministral 3, harmony, then Qwen3-Coder's XML, then
    the rest)."""
    ministral = detect_ministral(template_source)  # `[ARGS]` without `[CALL_ID]`
    if ministral is not None:
        return ministral
    if "<|channel|>" in template_source:
        return HARMONY
    for detect in _DETECTORS:
        fmt = detect(template_source)
        if fmt is not None:
            return fmt
    if "<tool_call>" in template_source:
        return HERMES
    if detect_granite(template_source):  # Granite 3.3's `<|tool_call|>` list
        return GRANITE
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if "<|python_tag|>" in template_source:
        return LLAMA3
    if "<TOOLCALL>[" in template_source:
        return NEMOTRON_V2
    if "<tool_calls>" in template_source and "<beginning_of_sentence>" in template_source:
        return MINIMAX_M1
    if "<tool_calls>[" in template_source and APRIEL_THINKING.close in template_source:
        return APRIEL
    if "functools[" in template_source:
        return FIREFUNCTION_V2
    if "<|role_sep|>" in template_source and "<|message_sep|>" in template_source:  # GigaChat 3
        return GIGACHAT3_1 if "<|function_call|>" in template_source else GIGACHAT3
    if _LLAMA3_ASK in template_source:  # Llama 3.2: the same JSON, one call a turn
        return LLAMA3_2
    return GENERIC


# What the Llama 3.1-3.3 templates tell the model; 3.2's alone has no <|python_tag|>.
_LLAMA3_ASK = 'Respond in the format {"name": function name, "parameters": dictionary'


def _grammar(
    fmt: ToolFormat, key: str, mode: str, parallel: bool, doc_key: str = ""
) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args = json_arguments(rules, i, tool)
        body = (
            f'"{{" {ws} "\\"name\\"" {ws} ":" {ws} {literal(json.dumps(tool.name))} {ws} "," {ws} '
            f'{literal(json.dumps(fmt.args_key))} {ws} ":" {ws} {args} {ws} "}}"'
        )
        alternatives.append(rules.add(f"call-{i}", body))
    call = rules.add("call", " | ".join(alternatives))
    calls = f"{call} ({fmt.separator} {call})*" if parallel else call
    root = " ".join(p for p in (fmt.prefix, calls, fmt.suffix) if p)
    lazy = mode == "auto"
    if doc_key:  # calls | the document: no longer free text, so not lazy
        value = document_rule(rules, doc_key)
        root, lazy = f"({root}) | {value}", False
    if fmt.think is not None and not lazy:  # a forced answer: the thinking first
        opening = "" if fmt.opened else literal(fmt.think.open)
        think = thinking_block(rules, fmt.think.close, opening, ws)
        root = f"{think} ({root})" if fmt.opened else f"({think})? ({root})"
    return GrammarSpec(
        rules.text(root),
        lazy=lazy,
        trigger_patterns=(fmt.trigger,) if lazy else (),
        trigger_words=(fmt.trigger_word,) if lazy and fmt.trigger_word else (),
    )


def _match_opener(buf: str, pieces: tuple[str, ...]) -> int | None | bool:
    """End index of the opener at the start of `buf`; True: it may still come; None: no."""
    i = 0
    for piece in pieces:
        while i < len(buf) and buf[i].isspace():
            i += 1
        head = buf[i : i + len(piece)]
        if len(head) < len(piece):
            return True if piece.startswith(head) else None
        if head != piece:
            return None
        i += len(piece)
    return i


class ToolParser:
    """Splits (reasoning-free) output into content and calls, incrementally.

    Text that may still turn out to open a call is held back, so the envelope of a call
    never leaks out as content."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._buf = ""
        self._state = "start" if fmt.marker is None else "text"
        self._scanner: CallScanner | None = None
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        self._buf += text
        if self._state == "start":
            found = _match_opener(self._buf, self.fmt.opener)
            if found is True:
                return out
            if found is None:
                self._state = "free"
            else:
                self._state = "calls"
                if self.fmt.consume_opener:
                    self._buf = self._buf[found:]
        if self._state == "free":
            out.append(Delta("content", self._buf))
            self._buf = ""
        elif self._state == "text":
            self._scan_marker(out)
        if self._state == "calls":
            self._scan_calls(out)
        return [d for d in out if d.text or d.kind == "start"]

    def _scan_marker(self, out: list[Delta]) -> None:
        marker = self.fmt.marker or ""
        at = self._buf.find(marker)
        if at >= 0:
            out.append(Delta("content", self._buf[:at]))
            self._buf = self._buf[at + len(marker) :]
            self._state = "calls"
            return
        keep = held_back(self._buf, (marker,))
        out.append(Delta("content", self._buf[: len(self._buf) - keep]))
        self._buf = self._buf[len(self._buf) - keep :]

    def _scan_calls(self, out: list[Delta]) -> None:
        while self._buf:
            if self._scanner is None:
                at = self._buf.find("{")
                if at < 0:
                    self._buf = ""  # separators and closing text between calls
                    return
                self._scanner = CallScanner(self.num_calls, (self.fmt.args_key,))
                self._buf = self._buf[at:]
            self._buf = self._scanner.feed(self._buf, out)
            if not self._scanner.done:
                return
            self._scanner = None
            self.num_calls += 1

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("start", "text", "free") and self._buf:
            out.append(Delta("content", self._buf))
        elif self._scanner is not None:
            self._scanner.flush(out)
        self._buf = ""
        return out


def tool_system_prompt(tools: list[Tool], choice: ToolChoice, parallel: bool) -> str:
    """How the generic format tells a model without tool support about the tools."""
    lines = ["You can call these tools (JSON schemas of their arguments):"]
    lines += [json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in tools]
    many = "one or more calls" if parallel else "exactly one call"
    lines.append(
        'To call tools, answer with only this JSON and nothing else: {"tool_calls": '
        f'[{{"name": "<tool name>", "arguments": {{...}}}}]}} with {many}.'
    )
    if choice.mode == "auto":
        lines.append("If no tool is needed, answer normally.")
    elif choice.mode == "named":
        lines.append(f"You must call the tool '{choice.name}'.")
    else:
        lines.append("You must call a tool.")
    return "\n".join(lines)


def generic_history(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool calls as the envelope the generic format asks for."""
    calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]
    envelope = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    content = message.get("content") or ""
    return {"role": "assistant", "content": f"{content}\n{envelope}" if content else envelope}
