"""The one regex converter: a Python-`re` / ECMAScript pattern -> a
`chat.textgrammar.Node` (matched whole), written as GBNF by chat/textgrammar.py's writers.

- `regex_to_gbnf`: a grammar whose whole output matches (vLLM's `guided_regex`, SGLang's
  `regex`), characters as they are.
- `pattern_to_gbnf`: JSON schema's `pattern`, for the JSON text inside a string's quotes
  (search semantics: without `^` / `$` anything may come before / after the match).
- `parse_regex`: a Lark terminal's `/.../flags`, a custom tool's `regex` format
  (chat/lark.py writes them as the JSON text or the raw text of a tool's input).

Supported: literals, escapes (`\\d \\w \\s` and their negations, ASCII as ECMAScript's;
`\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH \\UHHHHHHHH`, escaped punctuation), `.`, classes
(ranges, negation, escapes), groups (`(...)`, `(?:...)`, `(?P<n>...)`), alternation,
greedy and lazy quantifiers (a lazy one matches the same whole strings), anchors at the
ends, and the flags `i` and `s`. Lookaround, backreferences, `\\b` and possessive
quantifiers change what "matches" means beyond a context-free grammar: they raise
PatternError.
"""

from __future__ import annotations

import re

from chat.gbnf import RuleSet
from chat.textgrammar import (
    MAX_CODE,
    Alt,
    Chars,
    Lit,
    Node,
    Rep,
    Seq,
    TextGrammarError,
    casefolded,
    complement,
    merged,
    no_case,
    writer,
)

PatternError = TextGrammarError  # the name the schema and constraint layers catch

_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_CLASSES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}


class _Parser:
    def __init__(self, pattern: str, flags: str):
        self.src = pattern
        self.i = 0
        self.nocase = "i" in flags
        self.dotall = "s" in flags

    def error(self, what: str) -> TextGrammarError:
        return TextGrammarError(f"regex /{self.src}/: {what} (at {self.i})")

    def peek(self) -> str | None:
        return self.src[self.i] if self.i < len(self.src) else None

    def take(self) -> str:
        if self.i >= len(self.src):
            raise self.error("unexpected end")
        self.i += 1
        return self.src[self.i - 1]

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.i == len(self.src) - 1:
                self.take()  # an anchor at the end: the match is whole anyway
                break
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, atom: Node) -> Node:
        ch = self.peek()
        if ch not in ("*", "+", "?", "{"):
            return atom
        if ch == "{":
            end = self.src.find("}", self.i)
            body = self.src[self.i + 1 : end] if end > 0 else ""
            low_s, comma, high_s = body.partition(",")
            if end < 0 or not (low_s.isdigit() or (comma and not low_s)) or (
                    high_s and not high_s.isdigit()):  # fmt: skip
                return atom  # Python reads a brace that is no quantifier as itself
            self.i = end + 1
            low = int(low_s or 0)
            high = int(high_s) if high_s else None if comma else low
            if high is not None and high < low:
                raise self.error(f"bad quantifier {{{body}}}")
        else:
            self.take()
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if self.peek() == "+":
            raise self.error("possessive quantifiers are not supported")
        if self.peek() == "?":
            self.take()  # lazy: the same whole matches
        return Rep(atom, low, high)  # bounds too large to write: chat.gbnf `bounds`

    def atom(self) -> Node:
        ch = self.take()
        if ch == "(":
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.src.startswith("?P<", self.i) or (self.src.startswith("?<", self.i)
                                                         and self.src[self.i + 2 : self.i + 3]
                                                         not in ("=", "!")):  # fmt: skip
                self.i = self.src.index(">", self.i) + 1
            elif self.peek() == "?":
                raise self.error("lookaround, inline flags and conditionals are not supported")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.error("unbalanced parenthesis")
            self.take()
            return inner
        if ch == "[":
            return self.chars(self.char_class())
        if ch == ".":
            return Chars(((0, MAX_CODE),) if self.dotall else complement(((10, 10),)))
        if ch == "\\":
            return self.escape()
        if ch == "^" and self.i == 1:
            return Seq(())  # an anchor at the start
        if ch in "*+?)":
            raise self.error(f"unexpected '{ch}'")
        if ch in "^$":
            raise self.error("anchors are only supported at the ends of the pattern")
        return no_case(ch) if self.nocase else Lit(ch)

    def chars(self, ranges: tuple[tuple[int, int], ...]) -> Chars:
        return Chars(casefolded(ranges) if self.nocase else ranges)

    def escape(self) -> Node:
        ch = self.take()
        if ch.lower() in _CLASSES:
            ranges = _CLASSES[ch.lower()]
            return Chars(ranges if ch.islower() else complement(ranges))
        if ch in "AZ" and (self.i == 2 or self.i == len(self.src)):
            return Seq(())  # \A at the start, \Z at the end
        code = self.code_escape(ch)
        if code is None:
            raise self.error(f"the escape \\{ch} is not supported")
        text = chr(code)
        return no_case(text) if self.nocase else Lit(text)

    def code_escape(self, ch: str) -> int | None:
        """The character an escape stands for (None: not a character escape)."""
        if ch in _CONTROL:
            return ord(_CONTROL[ch])
        width = {"x": 2, "u": 4, "U": 8}.get(ch)
        if width is not None:
            digits = self.src[self.i : self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"bad \\{ch} escape")
            self.i += width
            return int(digits, 16)
        if ch.isalnum():
            return None  # \b, backreferences, \p{..}: not a character
        return ord(ch)

    def char_class(self) -> tuple[tuple[int, int], ...]:
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.peek() is None:
                raise self.error("unterminated character class")
            if self.peek() == "]" and not first:
                self.take()
                break
            first = False
            low = self.class_member()
            if isinstance(low, tuple):
                ranges += low
                continue
            if self.peek() == "-" and self.src[self.i + 1 : self.i + 2] not in ("]", ""):
                self.take()
                high = self.class_member()
                if isinstance(high, tuple) or high < low:
                    raise self.error("bad range in a character class")
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        out = merged(ranges)
        if self.nocase:
            out = casefolded(out)
        return complement(out) if negated else out

    def class_member(self) -> int | tuple[tuple[int, int], ...]:
        ch = self.take()
        if ch != "\\":
            return ord(ch)
        esc = self.take()
        if esc.lower() in _CLASSES:
            ranges = _CLASSES[esc.lower()]
            return ranges if esc.islower() else complement(ranges)
        if esc == "b":
            return 0x08  # backspace, inside a class
        code = self.code_escape(esc)
        if code is None:
            raise self.error(f"the escape \\{esc} is not supported in a class")
        return code


def parse_regex(pattern: str, flags: str = "") -> Node:
    """The whole-match language of `pattern` (`flags`: Lark's / Python's letters)."""
    unknown = set(flags) - set("isu")  # u (unicode) is Python 3's default
    if unknown:
        raise TextGrammarError(f"regex /{pattern}/: the flags {''.join(sorted(unknown))} "
                               "are not supported")  # fmt: skip
    parser = _Parser(pattern, flags)
    node = parser.alternation()
    if parser.peek() is not None:
        raise parser.error(f"unexpected '{parser.peek()}'")
    return node


def pattern_to_gbnf(pattern: str, rules: RuleSet) -> str:
    """A GBNF expression for the JSON text of strings that `pattern` matches (rules it
    needs are added to `rules`, which must also define chat.gbnf's `char`)."""
    expr = writer(rules, "re-", json_text=True).group(parse_regex(pattern))
    start = "" if pattern.startswith(("^", "\\A")) else "char*"  # chat.gbnf's JSON char
    end = "" if _ANCHORED_END.search(pattern) else "char*"
    return " ".join(p for p in (start, expr, end) if p)


# A `$` or `\Z` at the end that no backslash escapes.
_ANCHORED_END = re.compile(r"(?<!\\)(?:\\\\)*(?:\$|\\Z)$")


def regex_to_gbnf(pattern: str) -> str:
    """A complete grammar whose whole output matches `pattern` (anchors at its ends are
    allowed and change nothing: the match is always the whole output, as vLLM's)."""
    rules = RuleSet()
    return rules.text(writer(rules, "re-", json_text=False).group(parse_regex(pattern)))
