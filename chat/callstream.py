"""Output deltas, and an incremental scanner for one tool-call JSON object.

The scanner reads `{"name": "...", "arguments": {...}}` one character at a time and
reports the name once it is complete and the raw JSON text of the arguments value as
it arrives, so a stream can send argument fragments without waiting for the whole call.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass
from typing import Literal

_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass(frozen=True, slots=True)
class Delta:
    """One piece of parsed output. `call` kinds carry the call's index; `start` its id
    and name, `args` a fragment of the arguments' JSON text."""

    kind: Literal["content", "reasoning", "start", "args"]
    text: str = ""
    index: int = 0
    call_id: str = ""


class CallScanner:
    """Scans one call object; `feed` returns the characters left after it closes."""

    def __init__(self, index: int, args_keys: tuple[str, ...] = ("arguments", "parameters")):
        self.index = index
        self.args_keys = args_keys
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._token = ""  # a key or the name, as raw JSON text
        self._key: str | None = None
        self._mode: Literal["key", "colon", "value", "comma"] = "key"
        self._copying: Literal["args", "skip"] | None = None
        self._value_kind: Literal["container", "string", "scalar"] | None = None
        self._name: str | None = None
        self._args_seen = False
        self._started = False
        self._pending: list[str] = []  # argument text seen before the name

    def feed(self, text: str, out: list[Delta]) -> str:
        for i, ch in enumerate(text):
            self._step(ch, out)
            if self.done:
                return text[i + 1 :]
        return ""

    def _track(self, ch: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1

    def _step(self, ch: str, out: list[Delta]) -> None:
        if self._copying is not None:
            if not (self._value_kind == "scalar" and ch in ",}"):
                self._copy(ch, out)
                self._track(ch)
                ended = (self._value_kind == "container" and self._depth == 1) or (
                    self._value_kind == "string" and not self._in_string
                )
                if ended and not self._in_string:
                    self._copying, self._mode = None, "comma"
                return
            self._copying, self._mode = None, "comma"  # a scalar ends at , or }
        if self._in_string:  # inside a key or the name
            self._token += ch
            self._track(ch)
            if not self._in_string:
                self._end_token(out)
            return
        if ch.isspace():
            return
        if self._depth == 0:
            if ch == "{":
                self._depth = 1
            return
        if ch == "}" and self._mode in ("key", "comma"):
            self._depth = 0
            self._finish(out)
        elif (
            ch == '"'
            and self._mode == "key"
            or (ch == '"' and self._mode == "value" and self._key == "name")
        ):
            self._token = ch
            self._track(ch)
        elif ch == ":" and self._mode == "colon":
            self._mode = "value"
        elif ch == "," and self._mode == "comma":
            self._mode = "key"
        elif self._mode == "value":
            self._copying = "args" if self._key in self.args_keys else "skip"
            self._value_kind = "container" if ch in "{[" else "string" if ch == '"' else "scalar"
            self._copy(ch, out)
            self._track(ch)

    def _end_token(self, out: list[Delta]) -> None:
        value = json.loads(self._token)
        self._token = ""
        if self._mode == "key":
            self._key, self._mode = value, "colon"
        else:
            self._name, self._mode = value, "comma"
            self._maybe_start(out)

    def _copy(self, ch: str, out: list[Delta]) -> None:
        if self._copying != "args":
            return
        self._args_seen = True
        if self._started:
            out.append(Delta("args", ch, self.index))
        else:
            self._pending.append(ch)

    def _maybe_start(self, out: list[Delta]) -> None:
        if self._name is None or self._started:
            return
        self._started = True
        out.append(Delta("start", self._name, self.index, new_call_id()))
        if self._pending:
            out.append(Delta("args", "".join(self._pending), self.index))
            self._pending.clear()

    def _finish(self, out: list[Delta]) -> None:
        self.done = True
        if self._name is None:
            self._name = ""
        self._maybe_start(out)
        if not self._args_seen:
            out.append(Delta("args", "{}", self.index))

    def flush(self, out: list[Delta]) -> None:
        """The output ended inside the object: report what is known (a truncated call)."""
        if not self.done and self._name is not None:
            self._maybe_start(out)
