"""Grammar safety, in Python, before anything reaches llama.cpp's grammar code.

llama.cpp throws a C++ exception when its grammar is asked to accept a piece it does
not admit (`Unexpected empty grammar stack after accepting piece`), aborts on an
end-of-generation token the grammar does not allow, and may throw from `std::regex` (a
bad trigger pattern, or a deep recursion over a long output). Through ctypes any of
these ends the process. So:

- every accept is checked first (engine/llama/sampler.py `Sampler`), and a grammar that admits
  nothing more ends the generation;
- lazy triggers are matched here, in Python (`LazyTrigger`), never by llama.cpp: its
  grammar sampler is always a plain one that starts when the trigger fires, fed the
  triggered text one checked piece at a time;
- a grammar text whose parse would nest too deeply (a stack overflow in llama.cpp's
  recursive parser) or whose repetitions would expand to millions of rules is refused
  (`check_gbnf`) with the request's 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

MAX_NESTING = 200  # parentheses; llama.cpp's parser recurses once per level
MAX_REPEAT = 100_000  # sum of the bounds of all {m,n} repetitions (each expands to rules)
_REPEAT = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def check_gbnf(text: str) -> None:
    """Raise ValueError naming what makes this grammar unsafe to hand to llama.cpp."""
    depth = deepest = 0
    total = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "#":  # a comment, to the end of the line
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif ch in '"[':  # a literal or a character class: skip, honouring escapes
            close = '"' if ch == '"' else "]"
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        elif ch == "{":
            match = _REPEAT.match(text, i)
            if match:
                low, high = match.group(1), match.group(2)
                total += max(int(low or 0), int(high or 0))
                if total > MAX_REPEAT:
                    raise ValueError(f"invalid grammar: repetitions expand past {MAX_REPEAT} items")
                i = match.end() - 1
        i += 1
    if deepest > MAX_NESTING:
        raise ValueError(f"invalid grammar: parentheses nest deeper than {MAX_NESTING}")


class LazyTrigger:
    """Watches the output of a lazy grammar until it triggers.

    The rules are llama.cpp's: a trigger token arms the grammar with that token's
    text; otherwise the output so far (bytes) is matched whole against each pattern
    and, on a match, the grammar starts at the first non-empty group (else at the
    start of the match) and must accept everything from there.
    """

    def __init__(self, patterns: Sequence[str], tokens: Sequence[int]):
        try:
            self._patterns = [re.compile(p.encode("utf-8")) for p in patterns]
        except re.error as exc:
            raise ValueError(f"invalid grammar trigger pattern: {exc}") from None
        self.tokens = frozenset(tokens)
        self._buffer = b""

    def feed(self, piece: bytes) -> bytes | None:
        """The text the grammar starts with if this piece triggers it, else None."""
        self._buffer += piece
        for pattern in self._patterns:
            match = pattern.fullmatch(self._buffer)
            if match is None:
                continue
            start = next(
                (match.start(g) for g in range(1, pattern.groups + 1)
                 if match.end(g) > match.start(g) >= 0),
                match.start(),
            )  # fmt: skip
            text, self._buffer = self._buffer[start:], b""
            return text
        return None


def word_triggers(
    words: Sequence[str], tokenize: Callable[[str], list[int]]
) -> tuple[list[str], list[int]]:
    """Trigger words as (patterns, tokens): a word that `tokenize` (no BOS, special
    tokens parsed) makes one token triggers on that token; any other word becomes a
    pattern matching the output up to and including it (the grammar starts there)."""
    patterns: list[str] = []
    tokens: list[int] = []
    for word in words:
        ids = tokenize(word)
        if len(ids) == 1:
            tokens.append(ids[0])
        else:
            patterns.append(r"[\s\S]*?(" + re.escape(word) + r")[\s\S]*")
    return patterns, tokens
