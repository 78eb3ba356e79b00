"""Command R+: a list of actions in a fenced JSON block after `Action:`, each action the
tool's name and its parameters (Command R7B's keys, without its markers: the older
template asks for markdown).

    Action:
    ```json
    [{"tool_name": "get_time", "parameters": {"city": "Paris"}}]
    ```

llama.cpp has no handler of its own for it: its autoparser derives this syntax from the
template's renders (test-chat.cpp's Command R+ case). A list is read when it closes (a
call is released only once complete anyway); an `Action:` not followed by a fenced list
stays content. The template writes past calls indented (`tojson(indent=4)`), which the
compact grammar does not write: a call turn sent back replays as sampled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from chat.callformat import GrammarSpec, OwnFormat, document_rule, json_arguments, keyed_tools
from chat.callstream import BufferedParser, Delta, JsonNesting
from chat.formats_cohere import action_calls
from chat.gbnf import RuleSet, literal
from chat.tools import Tool

MARKER = "Action:"
# what may stand between the marker and the list: blanks and the fence's opening; and
# what may still become that
_FENCE = re.compile(r"\s*(?:```(?:json)?)?\s*")
_PARTIAL = re.compile(r"\s*(?:`{1,3}|```(?:j|js|jso|json))?\s*")
_HEAD_MAX = 16  # past this, text after `Action:` that is not yet a list is prose


def detect_command_r(source: str) -> OwnFormat | None:
    """The template that asks for `Action:` and a fenced JSON list of `tool_name`s."""
    ok = all(w in source for w in ("Action:", "```json", '"tool_name"', "<|CHATBOT_TOKEN|>"))
    return COMMAND_R_PLUS if ok else None


def _grammar(key: str, mode: str, parallel: bool, doc_key: str) -> GrammarSpec:
    rules = RuleSet()
    ws = rules.primitive("ws")
    alternatives = []
    for i, tool in enumerate(keyed_tools(key)):
        args, name = json_arguments(rules, i, tool), literal(json.dumps(tool.name))
        alternatives.append(rules.add(f"call-{i}", (
            f'"{{" {ws} "\\"tool_name\\"" {ws} ":" {ws} {name} {ws} "," {ws} '
            f'"\\"parameters\\"" {ws} ":" {ws} {args} {ws} "}}"'
        )))  # fmt: skip
    call = rules.add("call", " | ".join(alternatives))
    calls = f'{call} ({ws} "," {ws} {call})*' if parallel else call
    head = literal(MARKER + "\n```json\n[")
    close = f'"]" {ws} "```"'  # the template's `]````, or `]` and the fence on its own line
    action = rules.add("action", f"{head} {ws} {calls} {ws} {close}")
    if mode == "auto" and not doc_key:
        trigger = r"[\s\S]*?(Action:\s*```json)[\s\S]*"
        return GrammarSpec(rules.text(action), lazy=True, trigger_patterns=(trigger,))
    root = f"{action} | {document_rule(rules, doc_key)}" if doc_key else action
    return GrammarSpec(rules.text(root))


class CommandRParser(BufferedParser):
    """Splits output into content and action lists, incrementally: text that may still
    be `Action:` and the fence after it is held back until it resolves."""

    def __init__(self, tools: Sequence[Tool] = (), reasoning: bool = True):
        super().__init__()
        self._state = "text"  # text | head | list | tail
        self._json = JsonNesting()
        self._list = ""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("text", "head") and self._buf:
            out.append(Delta("content", self._buf))
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "text":
            text, word = self._until((MARKER,))
            out.append(Delta("content", text))
            if word is None:
                return False
            self._buf, self._state = MARKER + self._buf, "head"
            return True
        if self._state == "head":
            return self._head(out)
        if self._state == "list":
            return self._read_list(out)
        # tail: the blanks and the fence's close after the list
        self._buf = self._buf.lstrip()
        if not self._buf or self._may_become("```"):
            return False
        self._take("```")
        self._state = "text"
        return True

    def _head(self, out: list[Delta]) -> bool:
        """`Action:`, the fence, then `[`: a list; anything else: the text it is."""
        rest = self._buf[len(MARKER) :]
        fence = _FENCE.match(rest)
        end = fence.end() if fence else 0
        if end < len(rest) and rest[end] == "[":
            self._buf, self._state, self._json, self._list = rest[end:], "list", JsonNesting(), ""
            return True
        if _PARTIAL.fullmatch(rest) and len(rest) < _HEAD_MAX:
            return False  # the list may still come
        out.append(Delta("content", MARKER))
        self._buf, self._state = rest, "text"
        return True

    def _read_list(self, out: list[Delta]) -> bool:
        for i, ch in enumerate(self._buf):
            self._json.step(ch)
            if self._json.depth == 0 and not self._json.in_string:
                self._list += self._buf[: i + 1]
                self._buf, self._state = self._buf[i + 1 :], "tail"
                self._calls(self._list, out)
                return True
        self._list += self._buf
        self._buf = ""
        return False

    def _calls(self, text: str, out: list[Delta]) -> None:
        for name, args in action_calls(text):
            self._whole_call(name, args, out)


COMMAND_R_PLUS = OwnFormat("command-r-plus", _grammar, CommandRParser, owns_reasoning=False)
