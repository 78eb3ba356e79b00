"""Calls written as elements in a block: `<invoke name="NAME">` holding
`<parameter name="KEY"..>VALUE</parameter>` ones (MiniMax-M2's tags; DeepSeek's DSML writes
the same in its own namespace), read incrementally by the parsers of both.

    <minimax:tool_call>
    <invoke name="get_time">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

The formats differ only in what a call's opening writes of its arguments, what a
parameter's head holds besides the key, and how a value is typed: the parser's hooks.
"""

from __future__ import annotations

from abc import abstractmethod

from chat.callstream import BufferedParser, Delta


class InvokeElements(BufferedParser):
    """The states of a parser inside the block (entered in state "block"): "block"
    between calls, up to `_closing` (then "text"); "args" between a call's parameters;
    "value" inside one, its text gathered in `_value` until `PARAM_END`. Text between
    the elements that no grammar held is skipped."""

    INVOKE: str
    INVOKE_END: str
    PARAM: str
    PARAM_END: str
    _closing: str  # the block's end
    _state: str
    _value: str

    def _element_step(self, out: list[Delta]) -> bool:
        """One move inside the block; False when more text is needed."""
        if self._state == "value":
            text, word = self._until((self.PARAM_END,))
            self._value += text
            if word is None:
                return False
            self._close_param(self._value, out)
            self._state = "args"
            return True
        self._buf = self._buf.lstrip()
        opener = self.INVOKE if self._state == "block" else self.PARAM
        ender = self._closing if self._state == "block" else self.INVOKE_END
        if self._may_become(opener) or self._may_become(ender):
            return False
        if self._take(ender):
            if self._state == "args":
                out.append(Delta("args", "}", self.num_calls))
                self.num_calls += 1
            self._state = "text" if self._state == "block" else "block"
        elif self._buf.startswith(opener):
            end = self._buf.find('">', len(opener))
            if end < 0:
                return False
            head, self._buf = self._buf[len(opener) : end], self._buf[end + 2 :]
            if self._state == "block":
                self._start_call(head, out)
                out.append(Delta("args", self._open_call(head), self.num_calls))
                self._state = "args"
            else:
                self._open_param(head)
                self._state, self._value = "value", ""
        elif self._buf:
            self._buf = self._buf[1:]  # stray text inside the block (no grammar held it)
        return True

    @abstractmethod
    def _open_call(self, name: str) -> str:
        """The arguments' JSON text a call named `name` opens with."""

    @abstractmethod
    def _open_param(self, head: str) -> None:
        """A parameter opens: `head` is its tag's text after `name="` (its key first)."""

    @abstractmethod
    def _close_param(self, value: str, out: list[Delta]) -> None:
        """The open parameter's `value` is complete: its part of the arguments' JSON text."""
