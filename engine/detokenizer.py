"""Incremental detokenization with UTF-8 and stop-string hold-back.

Tokens arrive one at a time; text leaves only once it is certain: bytes of a character
that is still incomplete stay back, and so does any tail of the text that could be the
start of a stop string. A stop string therefore never reaches the client, even when it
is split across several tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_complete_utf8(data: bytes | bytearray) -> int:
    """Return the length of the longest prefix of `data` that ends on a character boundary."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte < 0x80:
            return n
        need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return n if back >= need else n - back
    return n  # only continuation bytes: invalid, let the decoder replace them


def held_stop_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best


class IncrementalDetokenizer:
    """Turns a token stream into text increments that are safe to send."""

    __slots__ = ("_pieces", "_raw", "_held", "_stops", "_include_stop", "stopped", "matched")

    def __init__(
        self, pieces: Sequence[bytes], stops: Sequence[str] = (), include_stop: bool = False
    ):
        self._pieces = pieces
        self._raw = bytearray()  # bytes of an incomplete character
        self._held = ""  # decoded text that may begin a stop string
        self._stops = tuple(s for s in stops if s)
        self._include_stop = include_stop
        self.stopped = False
        self.matched = ""  # the stop string that ended the text, once `stopped`

    @property
    def holding(self) -> bool:
        """Bytes of an incomplete character are held back."""
        return bool(self._raw)

    def push(self, token: int) -> str:
        """Add one token; return the text that can be released now."""
        piece = self._pieces[token]
        if not self._raw and piece.isascii():  # most tokens: no bytes to hold back
            text = piece.decode("ascii")
        else:
            self._raw += piece
            cut = split_complete_utf8(self._raw)
            if cut == 0:
                return ""
            text = self._raw[:cut].decode("utf-8", "replace")
            del self._raw[:cut]
        if not self._stops:
            return text
        return self._scan(self._held + text)

    def _scan(self, text: str) -> str:
        first = -1
        matched = ""
        for stop in self._stops:
            at = text.find(stop)
            if at != -1 and (first == -1 or at < first):
                first, matched = at, stop
        if first != -1:
            self.stopped = True
            self.matched = matched
            self._held = ""
            return text[: first + len(matched)] if self._include_stop else text[:first]
        hold = held_stop_prefix(text, self._stops)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """At the end of the sequence, release whatever was held back."""
        text = self._held + self._raw.decode("utf-8", "replace")
        self._held = ""
        self._raw.clear()
        return text
