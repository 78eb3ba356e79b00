"""Text from a server (model output, model names, error messages) as the model commands
print it: never as Rich markup (a name with `[/]` raised MarkupError), and without the
terminal's control and escape sequences (a model's output could clear the screen, set
the window title, plant an OSC 8 link or an OSC 52 clipboard write). Newlines and tabs
stay; everything else below U+0020, DEL and the C1 range go, with the whole escape
sequence an ESC starts, so no "[31m" is left behind."""

from __future__ import annotations

import re

from rich.text import Text

_ESCAPE = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]               # CSI: colours, cursor moves, erase
    | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)     # OSC: title, hyperlink, clipboard (BEL or ST)
    | \x1b[PX^_][^\x1b]*\x1b\\              # DCS, SOS, PM, APC strings
    | \x1b[ -/]*[0-~]                       # the other escapes (charsets, keypad, ...)
    | \x9b[0-?]*[ -/]*[@-~]                 # CSI in its 8-bit form
    """,
    re.VERBOSE,
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The start of an escape sequence that may go on in the next chunk of a stream (a
# string's ESC may be the first half of its ST terminator, ESC \).
_OPEN_TAIL = re.compile(
    r"(?:\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[PX^_][^\x1b]*\x1b?|[ -/]*)?"
    r"|\x9b[0-?]*[ -/]*)\Z"
)
_MAX_HELD = 4096  # an escape sequence held back longer than this is not one worth waiting for


def printable(text: str) -> str:
    """`text` without control characters and escape sequences, newlines and tabs kept."""
    return _CONTROL.sub("", _ESCAPE.sub("", text))


def plain(text: object) -> Text:
    """Untrusted text as a Rich renderable: printed as it is, never read as markup."""
    return Text(printable(str(text)))


class StreamFilter:
    """`printable` over a stream of chunks: an escape sequence split between two chunks
    (a model emits it token by token) is removed whole, not left as "[2J"."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, chunk: str) -> str:
        text = self._held + chunk
        tail = _OPEN_TAIL.search(text)
        cut = len(text)
        if tail is not None and cut - tail.start() <= _MAX_HELD:
            cut = tail.start()
        self._held = text[cut:]
        return printable(text[:cut])

    def finish(self) -> str:
        """What is held back at the end (an unfinished sequence: its text, ESC removed)."""
        held, self._held = self._held, ""
        return printable(held)
