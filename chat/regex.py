"""A practical subset of regexes -> GBNF: JSON-schema `pattern`s and whole-output regexes.

`pattern_to_gbnf`: the expression matches the *JSON text* inside the quotes of a string,
so characters that JSON escapes (quote, backslash, control characters) are written
escaped. `regex_to_gbnf`: a grammar whose whole output matches the regex (vLLM's
`guided_regex`, SGLang's `regex`), characters as they are. Supported:
literals, escapes (\\d \\w \\s \\D \\W \\S and escaped punctuation), `.`, character
classes (ranges, negation), groups `(...)` / `(?:...)`, alternation, quantifiers
`* + ? {n} {n,} {n,m}`, and `^` / `$` at the ends. A pattern without `^` (or `$`) may
have anything before (or after) its match, as JSON schema's search semantics say.
Anything else (lookaround, backreferences, lazy quantifiers, \\b) raises PatternError.
"""

from __future__ import annotations

from chat.gbnf import RuleSet, literal

# Characters a JSON string may hold raw; everything else in a class is excluded.
_JSON_UNSAFE = '"\\\\\\x00-\\x1F\\x7F'
_ANY = f"[^{_JSON_UNSAFE}]"
_NEGATED_ESCAPES = {"D": "0-9", "W": "a-zA-Z0-9_", "S": " \\t\\n\\r"}


class PatternError(ValueError):
    pass


def _class_char(ch: str) -> str:
    if ch.isascii() and ch.isalnum():
        return ch
    code = ord(ch)
    return (
        f"\\x{code:02X}"
        if code < 0x100
        else f"\\u{code:04X}"
        if code < 0x10000
        else f"\\U{code:08X}"
    )


def _char_literal(ch: str) -> str:
    # A JSON string writes these escaped; the regex means the character itself.
    return literal(ch if ch not in '"\\' and ord(ch) >= 0x20 else _json_escape(ch))


def _json_escape(ch: str) -> str:
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}.get(
        ch, f"\\u{ord(ch):04x}"
    )


class _Parser:
    """`json`: characters as a JSON string writes them (else as they are). Repetitions go
    through `rules` (chat.gbnf's one rule for bounds; compound atoms become rules)."""

    def __init__(self, pattern: str, rules: RuleSet, json: bool):
        self.src = pattern
        self.i = 0
        self.rules = rules
        self.json = json

    def peek(self) -> str | None:
        return self.src[self.i] if self.i < len(self.src) else None

    def take(self) -> str:
        ch = self.src[self.i]
        self.i += 1
        return ch

    def alternation(self) -> str:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.take()
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"

    def sequence(self) -> str:
        items: list[str] = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.i == len(self.src) - 1:
                break
            items.append(self.quantified(self.atom()))
        return " ".join(items) if items else '""'

    def quantified(self, atom: str) -> str:
        ch = self.peek()
        if ch not in ("*", "+", "?", "{"):
            return atom
        self.take()
        if ch == "{":
            end = self.src.find("}", self.i)
            if end < 0:
                raise PatternError("unterminated {} quantifier")
            body, self.i = self.src[self.i : end], end + 1
            low_s, comma, high_s = body.partition(",")
            if not low_s.isdigit() or (high_s and not high_s.isdigit()):
                raise PatternError(f"bad quantifier {{{body}}}")
            low, high = int(low_s), (int(high_s) if high_s else None if comma else int(low_s))
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if self.peek() in ("?", "+"):
            raise PatternError("lazy and possessive quantifiers are not supported")
        return self.rules.repeat("re", atom, low, high)

    def atom(self) -> str:
        ch = self.take()
        if ch == "(":
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise PatternError("lookaround and named groups are not supported")
            inner = self.alternation()
            if self.peek() != ")":
                raise PatternError("unbalanced parenthesis")
            self.take()
            return f"({inner})"
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return _ANY if self.json else "[^\\n]"
        if ch == "\\":
            return self.escape()
        if ch in "*+?{)":
            raise PatternError(f"unexpected '{ch}'")
        if ch in "^$":
            raise PatternError("anchors are only supported at the ends of the pattern")
        return self.char(ch)

    def char(self, ch: str) -> str:
        return _char_literal(ch) if self.json else literal(ch)

    def escape(self) -> str:
        if self.peek() is None:
            raise PatternError("trailing backslash")
        ch = self.take()
        if ch in ("d", "w") or (ch == "s" and not self.json):
            return "[" + "".join(_range_text(lo, hi) for lo, hi in self.class_ranges(ch)) + "]"
        if ch == "s":
            return '(" " | "\\\\t" | "\\\\n" | "\\\\r")'
        if ch in _NEGATED_ESCAPES:
            return f"[^{_NEGATED_ESCAPES[ch]}{_JSON_UNSAFE if self.json else ''}]"
        if ch in "nrt":
            raw = {"n": "\n", "r": "\r", "t": "\t"}[ch]
            return literal(_json_escape(raw) if self.json else raw)
        if ch.isalnum():
            raise PatternError(f"the escape \\{ch} is not supported")
        return self.char(ch)

    def class_ranges(self, ch: str) -> tuple[tuple[int, int], ...]:
        return _RAW_SPACE if ch == "s" and not self.json else _CLASS_RANGES[ch]

    def char_class(self) -> str:
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            ch = self.peek()
            if ch is None:
                raise PatternError("unterminated character class")
            if ch == "]" and not first:
                self.take()
                break
            first = False
            low = self.class_member()
            if isinstance(low, list):
                ranges += low
                continue
            if self.peek() == "-" and self.src[self.i + 1 : self.i + 2] not in ("]", ""):
                self.take()
                high = self.class_member()
                if isinstance(high, list) or high < low:
                    raise PatternError("bad range in a character class")
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        if negated:
            body = "".join(_range_text(lo, hi) for lo, hi in ranges)
            return f"[^{body}{_JSON_UNSAFE if self.json else ''}]"
        # JSON-unsafe characters in a positive class are left out (the output stays a
        # subset of what the pattern allows, so it always validates).
        safe = _subtract(ranges, _UNSAFE_CODES) if self.json else ranges
        if not safe:
            raise PatternError("a character class holds only characters JSON must escape")
        return "[" + "".join(_range_text(lo, hi) for lo, hi in safe) + "]"

    def class_member(self) -> int | list[tuple[int, int]]:
        ch = self.take()
        if ch != "\\":
            return ord(ch)
        if self.peek() is None:
            raise PatternError("trailing backslash")
        esc = self.take()
        if esc in _CLASS_RANGES:
            return list(self.class_ranges(esc))
        if esc in "nrt":
            return ord({"n": "\n", "r": "\r", "t": "\t"}[esc])
        if esc.isalnum():
            raise PatternError(f"the escape \\{esc} is not supported in a class")
        return ord(esc)


_CLASS_RANGES = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x20, 0x20),),  # tab and newline would need JSON escapes: left out
}
_RAW_SPACE = ((0x09, 0x0D), (0x20, 0x20))  # \t \n \v \f \r and the space
_UNSAFE_CODES = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))


def _subtract(
    ranges: list[tuple[int, int]], holes: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for h_lo, h_hi in holes:
            nxt = []
            for a, b in pieces:
                if b < h_lo or a > h_hi:
                    nxt.append((a, b))
                    continue
                if a < h_lo:
                    nxt.append((a, h_lo - 1))
                if b > h_hi:
                    nxt.append((h_hi + 1, b))
            pieces = nxt
        out += pieces
    return out


def _range_text(lo: int, hi: int) -> str:
    return _class_char(chr(lo)) if lo == hi else f"{_class_char(chr(lo))}-{_class_char(chr(hi))}"


def pattern_to_gbnf(pattern: str, rules: RuleSet) -> str:
    """A GBNF expression for the JSON text of strings that `pattern` matches (rules it
    needs are added to `rules`, which must also define chat.gbnf's `char`)."""
    anchored_start = pattern.startswith("^")
    parser = _Parser(pattern[1:] if anchored_start else pattern, rules, json=True)
    expr = parser.alternation()
    anchored_end = parser.peek() == "$"
    if anchored_end:
        parser.take()
    if parser.peek() is not None:
        raise PatternError(f"unexpected '{parser.peek()}' at {parser.i}")
    free = "char*"  # the JSON string character rule of chat.gbnf
    return " ".join(
        p for p in ("" if anchored_start else free, f"({expr})", "" if anchored_end else free) if p
    )


def regex_to_gbnf(pattern: str) -> str:
    """A complete grammar whose whole output matches `pattern` (anchors at its ends are
    allowed and change nothing: the match is always the whole output, as vLLM's)."""
    rules = RuleSet()
    parser = _Parser(pattern[1:] if pattern.startswith("^") else pattern, rules, json=False)
    expr = parser.alternation()
    if parser.peek() == "$":
        parser.take()
    if parser.peek() is not None:
        raise PatternError(f"unexpected '{parser.peek()}' at {parser.i}")
    return rules.text(expr)
