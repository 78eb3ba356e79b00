"""DeepSeek V3.2 and V4: calls as DSML markup, thinking in `<think>`.

    <think>plan</think>Sure.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_time">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

V4 names the block `tool_calls` (V3.2 `function_calls`). As llama.cpp reads it
(common/parsers/deepseek.cpp, test-chat.cpp's DeepSeek V3.2 / V4 cases): the template
that defines `dsml_token`; a parameter whose schema admits a string is raw text up to
its close (`string="true"`), any other JSON (`string="false"`); required parameters
first (here in any order, chat/tagged_args.py), then optional ones. The generation
prompt opens `<think>` when the template's `thinking` (or `enable_thinking`) is on, and
closes it otherwise (V3.2 `<think></think>`, V4 a bare `</think>`); the thinking ends at
`</think>` or at the block's opening (a model may call from inside it), so the parser
splits it itself and reads the prompt it follows (`for_prompt`). V4's template writes a
turn's tool results in the order of its calls; llama.cpp sorts them so first, and so
does `adapt_messages`.

Differences from llama.cpp, each for a reason: a forced (`required` / named) call may
follow the thinking but no free text (llama.cpp's grammar admits content up to the
block, which nothing but the block ends; as DeepSeek V3.1's, chat/formats_sections.py);
in `auto` mode with a response schema the answer is the document itself, not V4's
fenced ```json block (kvserve's response format beside tools is one grammar for every
family).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chat.callformat import (
    CallParser,
    GrammarSpec,
    MemoizedGrammar,
    input_grammar,
    keyed_tools,
    lazy_at,
    thinking_block,
    thinking_then,
)
from chat.callstream import Delta, ThinkingParser
from chat.gbnf import RuleSet, literal
from chat.invoke_elements import InvokeElements
from chat.tagged_args import Tags, tagged_arguments
from chat.tools import INPUT, Tool

DSML = "｜DSML｜"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
INVOKE, INVOKE_END = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM, PARAM_END = f'<{DSML}parameter name="', f"</{DSML}parameter>"
SEPARATOR = "\n\n"  # what the template writes between the content and the block
_TEXT_RULE = "dsml-text"
_STRING_RULE = "dsml-string"


@dataclass(frozen=True, slots=True)
class DsmlFormat(MemoizedGrammar):
    name: str
    block: str  # the block's element: function_calls (V3.2) or tool_calls (V4)
    sort_results: bool  # V4: a turn's results in the order of its calls
    thinking: bool = False  # set by `for_prompt`: the prompt opened `<think>`
    native: bool = True
    owns_reasoning: bool = True

    @property
    def opening(self) -> str:
        return f"<{DSML}{self.block}>"

    @property
    def closing(self) -> str:
        return f"</{DSML}{self.block}>"

    def for_prompt(self, prompt: str) -> DsmlFormat:
        """This format as it reads the turn after `prompt`."""
        return replace(self, thinking=prompt.rstrip().endswith(THINK_OPEN))

    def bound_to(self) -> str:
        return str(self.thinking)

    def build(self, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
        return _grammar(self, key, mode, parallel, doc_key)

    def parser(self, tools: Sequence[Tool] = (), reasoning: bool = True) -> CallParser:
        return DsmlParser(self, tools, reasoning)

    def adapt_messages(self, source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sort_results(messages) if self.sort_results else messages

    def adapt_prompt(self, text: str, generation: bool) -> str:
        return text


DEEPSEEK_V32 = DsmlFormat("deepseek-v3.2", "function_calls", sort_results=False)
DEEPSEEK_V4 = DsmlFormat("deepseek-v4", "tool_calls", sort_results=True)


def detect_dsml(source: str) -> DsmlFormat | None:
    """llama.cpp's rule (common/chat.cpp): the template defines `dsml_token`; V4 is the one
    without `function_calls`."""
    if "dsml_token" not in source or "DSML" not in source:
        return None
    if "function_calls" in source:
        return DEEPSEEK_V32
    return DEEPSEEK_V4 if "tool_calls" in source else None


def sort_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run of user/tool messages with its tool results in the order of the calls of
    the assistant turn before it (matched by call id; an unknown id sorts first, stably)."""
    out = list(messages)
    order: dict[str, int] = {}
    i = 0
    while i < len(out):
        message = out[i]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            order = {c.get("id", ""): n for n, c in enumerate(message["tool_calls"]) if c.get("id")}
        if message.get("role") not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(out) and out[end].get("role") in ("user", "tool"):
            end += 1
        places = [k for k in range(i, end) if out[k].get("role") == "tool"]
        if len(places) > 1 and order:
            results = sorted((out[k] for k in places),
                             key=lambda m: order.get(m.get("tool_call_id", ""), 0))  # fmt: skip
            for k, result in zip(places, results, strict=True):
                out[k] = result
        i = end
    return out


def _grammar(fmt: DsmlFormat, key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    text_rule = f"{_TEXT_RULE}-0"  # tagged_args' raw-text rule: a value that may be a string

    def param(name: str, value: str, string: bool = False) -> str:
        string = string or value == text_rule or value.startswith(_STRING_RULE)
        flag = "true" if string else "false"
        head = literal(f'{PARAM}{name}" string="{flag}">')
        return f"{head} {value} {literal(PARAM_END)} {ws}"

    tags = Tags(param, PARAM_END, _TEXT_RULE, _bounded_string)
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        if tool.grammar is not None:  # a custom tool: its one input, raw text (a string)
            text = input_grammar(rules, i, tool.grammar, json_text=False)
            args = param(INPUT, text, string=True)
        else:
            args = tagged_arguments(rules, i, tool, tags)
        head = literal(f'{INVOKE}{tool.name}">\n')
        body = " ".join(p for p in (head, args, ws, literal(INVOKE_END)) if p)
        alternatives.append(rules.add(f"call-{i}", body))
    call = rules.add("call", " | ".join(alternatives))
    calls = f"{call} ({ws} {call})*" if parallel else call
    block = rules.add("block", f"{literal(fmt.opening)} {ws} {calls} {ws} {literal(fmt.closing)}")
    if mode == "auto" and not doc_key:
        return lazy_at(rules.text(block), fmt.opening)
    # the template writes "\n\n" before the block (llama.cpp: content, then its space rule)
    answer = f'({ws} | "\\n\\n") {block}'
    if fmt.thinking:  # the prompt opened <think>: its rest and </think> may come first
        return thinking_then(rules, thinking_block(rules, THINK_CLOSE), answer, doc_key)
    if doc_key:
        return thinking_then(rules, '""', answer, doc_key)
    return GrammarSpec(rules.text(answer))


def _bounded_string(rules: RuleSet, schema: Any) -> str | None:
    """A string parameter with length bounds: that many characters without `<`, as the
    schema asks. llama.cpp takes any text up to the close whatever the schema, and a
    model may go on past a close-like tag (SmolLM2 wrote `</｜DSML｜parameter name=..`
    inside the value until max_tokens). None: the raw text up to the close (no bounds,
    or a schema that admits other types as well)."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return None
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if not low and high is None:
        return None
    chars = rules.repeat(f"{_STRING_RULE}-chars", "[^<]", low, None if high is None else int(high))
    return rules.add(_STRING_RULE, chars)


class DsmlParser(InvokeElements, ThinkingParser):
    """Thinking, content and the calls block, incrementally; text that may still be a
    marker is held back until it resolves. A value is typed by its `string` attribute."""

    LEAD = ((THINK_OPEN, "think"),)
    THINK_CLOSE = THINK_CLOSE
    INVOKE, INVOKE_END, PARAM, PARAM_END = INVOKE, INVOKE_END, PARAM, PARAM_END

    def __init__(self, fmt: DsmlFormat, tools: Sequence[Tool], reasoning: bool):
        super().__init__(tools, reasoning)
        self.OPENERS = {SEPARATOR + fmt.opening: "block", fmt.opening: "block"}
        self._closing = fmt.closing
        if reasoning and fmt.thinking:
            self._state = "think"
        self._string = True  # the open value's `string` attribute
        self._key = ""
        self._value = ""  # the open value's text so far
        self._num_args = 0

    def _step(self, out: list[Delta]) -> bool:
        if self._state != "think":
            return super()._step(out)
        # the thinking ends at </think>, or (tools offered) at the block's opening
        words = (THINK_CLOSE, *self.OPENERS) if self._calls else (THINK_CLOSE,)
        text, word = self._until(words)
        out.append(Delta("reasoning", text))
        if word is None:
            return False
        self._state = "text" if word == THINK_CLOSE else "block"
        return True

    def _call_step(self, out: list[Delta]) -> bool:
        return self._element_step(out)

    def _open_call(self, name: str) -> str:
        self._num_args = 0
        return "{"

    def _open_param(self, head: str) -> None:
        self._key, _, attribute = head.partition('"')
        self._string = 'string="false' not in attribute

    def _close_param(self, value: str, out: list[Delta]) -> None:
        if self._string:
            text = json.dumps(value, ensure_ascii=False)
        else:
            try:
                text = json.dumps(json.loads(value), ensure_ascii=False)
            except ValueError:
                text = json.dumps(value, ensure_ascii=False)  # not JSON: the text it is
        head = ", " if self._num_args else ""
        self._num_args += 1
        out.append(Delta("args", f"{head}{json.dumps(self._key, ensure_ascii=False)}: {text}",
                         self.num_calls))  # fmt: skip

    def _finish_call(self, out: list[Delta]) -> None:
        """A call cut off was reported as started and is never complete (truncated)."""
