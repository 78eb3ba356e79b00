"""Output deltas, what every format's incremental parser shares, and an incremental
scanner for one tool-call JSON object.

The scanner reads `{"name": "...", "arguments": {...}}` one character at a time and
reports the name once it is complete and the raw JSON text of the arguments value as
it arrives, so a stream can send argument fragments without waiting for the whole call.
"""

from __future__ import annotations

import json
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

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


def held_back(buf: str, words: Sequence[str]) -> int:
    """How many characters at the end of `buf` may begin one of `words`: a parser holds
    them back until the next text shows whether they do."""
    return max(
        (k for w in words for k in range(1, min(len(w), len(buf) + 1)) if w.startswith(buf[-k:])),
        default=0,
    )


class BufferedParser(ABC):
    """The frame of a format's incremental parser: text waits in `_buf`, and `_step`
    moves the parser's state on over it until it needs more text (it returns False).
    Empty deltas never leave (a call's start does: it carries the name)."""

    def __init__(self) -> None:
        self._buf = ""
        self.num_calls = 0

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._step(out):
            pass
        return [d for d in out if d.text or d.kind == "start"]

    @abstractmethod
    def finish(self) -> list[Delta]: ...

    @abstractmethod
    def _step(self, out: list[Delta]) -> bool:
        """One move over the buffer; False when more text is needed."""

    def _until(self, words: Sequence[str]) -> tuple[str, str | None]:
        """Take from the buffer the text before the first of `words` and that word (the
        buffer then holds what follows it). None of them there: the text that cannot
        begin one, and None; the rest stays until the next text resolves it."""
        found = min(((self._buf.find(w), w) for w in words if w in self._buf), default=None)
        if found is None:
            cut = len(self._buf) - held_back(self._buf, words)
            text, self._buf = self._buf[:cut], self._buf[cut:]
            return text, None
        at, word = found
        text, self._buf = self._buf[:at], self._buf[at + len(word) :]
        return text, word

    def _start_call(self, name: str, out: list[Delta]) -> None:
        """The call numbered `num_calls` begins: its name, and the id kvserve issues."""
        out.append(Delta("start", name, self.num_calls, new_call_id()))

    def _whole_call(self, name: str, args: Any, out: list[Delta]) -> None:
        """A call read whole (a format whose arguments are not JSON text as sampled):
        its start, its arguments as JSON text, and it counts as complete."""
        self._start_call(name, out)
        out.append(Delta("args", json.dumps(args, ensure_ascii=False), self.num_calls))
        self.num_calls += 1

    def _may_become(self, word: str) -> bool:
        """The buffer is a beginning of `word`, too short to tell: wait for more text."""
        return word.startswith(self._buf) and len(self._buf) < len(word)

    def _take(self, word: str) -> bool:
        """The buffer starts with `word`: it is taken off."""
        if not self._buf.startswith(word):
            return False
        self._buf = self._buf[len(word) :]
        return True


class BlockParser(BufferedParser):
    """The frame of a parser for a format that splits no thinking of its own (the plan's
    `<think>` split has it): content (state "text") up to where the calls open, held back
    while the text may still open them (`_text`: by default at `OPEN`, in state "block"),
    then the format's own states (`_block_step`) until they come back to "text". An output
    that ends in them (a call cut off) was reported as started, never complete."""

    OPEN: str

    def __init__(self) -> None:
        super().__init__()
        self._state = "text"

    def finish(self) -> list[Delta]:
        out = [Delta("content", self._buf)] if self._state == "text" and self._buf else []
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "text":
            return self._text(out)
        return self._block_step(out)

    def _text(self, out: list[Delta]) -> bool:
        text, word = self._until((self.OPEN,))
        out.append(Delta("content", text))
        if word is None:
            return False
        self._state = "block"
        return True

    @abstractmethod
    def _block_step(self, out: list[Delta]) -> bool:
        """One move in the format's own states (after the text)."""


class ThinkingParser(BufferedParser):
    """The frame of a parser for a format that splits its own thinking and writes it
    first: a thinking block may open the answer (`LEAD`: the marks that may stand first
    and the state each leads to, "think" or "text"), its text up to `THINK_CLOSE` is
    reasoning; then content up to one of the format's call openers (`OPENERS`: each
    opener and the state it leads to), and the format's own states from there
    (`_call_step`). With `reasoning` off (`reasoning_format: "none"`) the thinking stays
    in the content; without tools everything after the thinking is content."""

    LEAD: tuple[tuple[str, str], ...]
    LEAD_BLANKS = False  # blanks may stand before the lead mark
    THINK_CLOSE: str
    OPENERS: dict[str, str]
    CONTENT_STATES: tuple[str, ...] = ()  # the format's states whose text at the end is content

    def __init__(self, tools: Sequence[Any], reasoning: bool):
        super().__init__()
        self._calls = bool(tools)
        self._state = "start" if reasoning else "text"

    def _step(self, out: list[Delta]) -> bool:
        state = self._state
        if state == "start":
            return self._lead()
        if state == "think":
            text, word = self._until((self.THINK_CLOSE,))
            out.append(Delta("reasoning", text))
            if word is None:
                return False
            self._state = "text"
        elif state == "text":
            if not self._calls:
                out.append(Delta("content", self._buf))
                self._buf = ""
                return False
            text, word = self._until(tuple(self.OPENERS))
            out.append(Delta("content", text))
            if word is None:
                return False
            self._state = self.OPENERS[word]
        else:
            return self._call_step(out)
        return True

    def _lead(self) -> bool:
        head = self._buf.lstrip() if self.LEAD_BLANKS else self._buf
        for mark, state in self.LEAD:
            if mark.startswith(head) and len(head) < len(mark):
                return False
            if head.startswith(mark):
                self._buf, self._state = head[len(mark) :], state
                return True
        self._state = "text"
        return True

    @abstractmethod
    def _call_step(self, out: list[Delta]) -> bool:
        """One move in the format's own states (after an opener)."""

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state in ("start", "text", *self.CONTENT_STATES) and self._buf:
            out.append(Delta("content", self._buf))
        elif self._state == "think" and self._buf:
            out.append(Delta("reasoning", self._buf))
        else:
            self._finish_call(out)
        self._buf = ""
        return out

    @abstractmethod
    def _finish_call(self, out: list[Delta]) -> None:
        """The output ended in the format's own states: a call cut off is reported as
        started, never complete (the plan counts it truncated)."""


class JsonNesting:
    """Where a JSON text stands, one character at a time: how deep in brackets, whether
    inside a string (where brackets do not count)."""

    __slots__ = ("depth", "in_string", "_escape")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self._escape = False

    def step(self, ch: str) -> None:
        if self.in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


class CallScanner:
    """Scans one call object; `feed` returns the characters left after it closes."""

    def __init__(self, index: int, args_keys: tuple[str, ...] = ("arguments", "parameters")):
        self.index = index
        self.args_keys = args_keys
        self.done = False
        self._json = JsonNesting()
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

    def _step(self, ch: str, out: list[Delta]) -> None:
        if self._copying is not None:
            if not (self._value_kind == "scalar" and ch in ",}"):
                self._copy(ch, out)
                self._json.step(ch)
                ended = (self._value_kind == "container" and self._json.depth == 1) or (
                    self._value_kind == "string" and not self._json.in_string
                )
                if ended and not self._json.in_string:
                    self._copying, self._mode = None, "comma"
                return
            self._copying, self._mode = None, "comma"  # a scalar ends at , or }
        if self._json.in_string:  # inside a key or the name
            self._token += ch
            self._json.step(ch)
            if not self._json.in_string:
                self._end_token(out)
            return
        if ch.isspace():
            return
        if self._json.depth == 0:
            if ch == "{":
                self._json.depth = 1
            return
        if ch == "}" and self._mode in ("key", "comma"):
            self._json.depth = 0
            self._finish(out)
        elif (
            ch == '"'
            and self._mode == "key"
            or (ch == '"' and self._mode == "value" and self._key == "name")
        ):
            self._token = ch
            self._json.step(ch)
        elif ch == ":" and self._mode == "colon":
            self._mode = "value"
        elif ch == "," and self._mode == "comma":
            self._mode = "key"
        elif self._mode == "value":
            self._copying = "args" if self._key in self.args_keys else "skip"
            self._value_kind = "container" if ch in "{[" else "string" if ch == '"' else "scalar"
            self._copy(ch, out)
            self._json.step(ch)

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
