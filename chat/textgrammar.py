"""Grammars of text (a regex, a Lark grammar) as an expression tree, and its two GBNF
writers.

The parsers (chat/regex.py, chat/lark.py) produce `Node`s; a writer turns them into GBNF
rules in a `RuleSet`:
- `PlainText`: the characters as they are (a whole output: vLLM's `guided_regex`; the raw
  text of a Qwen3-Coder XML parameter).
- `JsonText`: the *JSON text* of a string holding them (a custom tool's `input` in a JSON
  tool call, a schema's `pattern`): a quote, a backslash and the control characters are
  written escaped (`\\"`, `\\\\`, `\\n`, ...), everything else raw. The language is kept
  whole: a line of a patch may hold a quote or a backslash.

Repetitions go through `RuleSet.repeat` (chat.gbnf's one rule for bounds).
"""

from __future__ import annotations

from dataclasses import dataclass

from chat.gbnf import RuleSet, literal

MAX_CODE = 0x10FFFF


class TextGrammarError(ValueError):
    """A grammar kvserve cannot turn into GBNF (the message says what)."""


@dataclass(frozen=True, slots=True)
class Lit:
    text: str


@dataclass(frozen=True, slots=True)
class Chars:
    ranges: tuple[tuple[int, int], ...]  # sorted, merged, inclusive code point ranges


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Rep:
    item: Node
    low: int
    high: int | None  # None: unbounded


@dataclass(frozen=True, slots=True)
class Ref:
    name: str  # a rule of the grammar (Lark), resolved by the writer


Node = Lit | Chars | Seq | Alt | Rep | Ref
Ranges = tuple[tuple[int, int], ...]


def merged(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return tuple(out)


def casefolded(ranges: Ranges) -> Ranges:
    """`ranges` with the other case of every ASCII letter in it (a case-insensitive flag)."""
    extra = []
    for lo, hi in ranges:
        for a, b, shift in ((65, 90, 32), (97, 122, -32)):
            if lo <= b and hi >= a:
                extra.append((max(lo, a) + shift, min(hi, b) + shift))
    return merged([*ranges, *extra])


def no_case(text: str) -> Node:
    """A literal matched in either case (Lark's `"..."i`, a regex's `i` flag)."""
    items: list[Node] = []
    for ch in text:
        if ch.lower() != ch.upper() and ch.isascii():
            items.append(Chars(merged([(ord(ch.lower()),) * 2, (ord(ch.upper()),) * 2])))
        else:
            items.append(Lit(ch))
    return Seq(tuple(items))


# What JSON writes escaped: control characters, the quote, the backslash (and DEL, which
# chat.gbnf's `char` also keeps out of the raw set).
_UNSAFE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))
_SHORT = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x08: "\\b",
          0x0C: "\\f"}  # fmt: skip


def json_escaped(code: int) -> str:
    """How a JSON string writes one character."""
    if not any(lo <= code <= hi for lo, hi in _UNSAFE):
        return chr(code)
    return _SHORT.get(code, f"\\u{code:04x}")


def _class_char(code: int) -> str:
    ch = chr(code)
    if ch.isascii() and ch.isalnum():
        return ch
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else (
        f"\\U{code:08X}")  # fmt: skip


def _class(ranges: Ranges, negated: bool = False) -> str:
    body = "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
                   for lo, hi in ranges)  # fmt: skip
    return f"[^{body}]" if negated else f"[{body}]"


def _shortest_class(ranges: Ranges) -> str:
    """`ranges` as a class, negated where that is shorter (`.`: [^\\x0A])."""
    rest = complement(ranges)
    if not rest:
        return "."  # every character (llama.cpp's `.` matches any one)
    return _class(rest, True) if len(rest) < len(ranges) else _class(ranges)


class TextWriter:
    """Writes `Node`s as GBNF into `rules`; rule names of the source grammar map through
    `names`, and the rules the writer adds get `prefix` (several tools share a RuleSet).
    Subclasses say how a literal and a set of characters are written."""

    def __init__(self, rules: RuleSet, prefix: str, names: dict[str, str] | None = None):
        self.rules = rules
        self.prefix = prefix
        self.names = names or {}  # source rule name -> GBNF rule name

    def lit(self, text: str) -> str:
        raise NotImplementedError

    def chars(self, ranges: Ranges) -> str:
        raise NotImplementedError

    def expr(self, node: Node) -> str:
        if isinstance(node, Lit):
            return self.lit(node.text) if node.text else '""'
        if isinstance(node, Chars):
            if not node.ranges:
                raise TextGrammarError("an empty character class matches nothing")
            return self.chars(node.ranges)
        if isinstance(node, Seq):
            parts = [p for p in map(self.group, _joined(node.items)) if p != '""']
            return " ".join(parts) if parts else '""'
        if isinstance(node, Alt):
            return " | ".join(self.expr(o) for o in node.options)
        if isinstance(node, Rep):
            item = self.group(node.item)
            return self.rules.repeat(f"{self.prefix}rep", item, node.low, node.high)
        return self.names[node.name]

    def group(self, node: Node) -> str:
        text = self.expr(node)
        return f"({text})" if isinstance(node, Alt) and len(node.options) > 1 else text


class PlainText(TextWriter):
    """The characters as they are."""

    def lit(self, text: str) -> str:
        return literal(text)

    def chars(self, ranges: Ranges) -> str:
        return _shortest_class(ranges)


class JsonText(TextWriter):
    """The JSON text of a string holding the characters."""

    def lit(self, text: str) -> str:
        return literal("".join(json_escaped(ord(c)) for c in text))

    def chars(self, ranges: Ranges) -> str:
        """The raw characters as one class, each one JSON escapes as its escape."""
        parts = []
        safe = _subtract(ranges, _UNSAFE)
        if safe:  # its complement holds the unsafe characters: [^...] leaves them out
            parts.append(_shortest_class(safe))
        escaped = [c for lo, hi in _UNSAFE for c in range(lo, hi + 1)
                   if any(x <= c <= y for x, y in ranges)]  # fmt: skip
        if escaped:
            parts.append(_escapes(escaped))
        if len(parts) == 1:
            return parts[0]
        return self.rules.add(f"{self.prefix}chars", " | ".join(parts))


def writer(rules: RuleSet, prefix: str, json_text: bool,
           names: dict[str, str] | None = None) -> TextWriter:  # fmt: skip
    """The JSON-text writer (`json_text`) or the plain one."""
    return (JsonText if json_text else PlainText)(rules, prefix, names)


def _escapes(codes: list[int]) -> str:
    """The JSON escapes of `codes` as one alternative after the backslash: the sampler
    then keeps one grammar stack for them, not one per character."""
    short = [ord(_SHORT[c][1]) for c in codes if c in _SHORT]
    by_head: dict[str, list[int]] = {}
    for c in codes:
        if c not in _SHORT:
            digits = f"{c:04x}"
            by_head.setdefault(digits[:3], []).append(ord(digits[3]))
    alts = [_class(merged([(c, c) for c in short]))] if short else []
    if by_head:
        tails = [f"{literal(head)} {_class(merged([(c, c) for c in last]))}"
                 for head, last in by_head.items()]  # fmt: skip
        alts.append(f'"u" ({" | ".join(tails)})' if len(tails) > 1 else f'"u" {tails[0]}')
    return f'"\\\\" ({" | ".join(alts)})' if len(alts) > 1 else f'"\\\\" {alts[0]}'


def _joined(items: tuple[Node, ...]) -> list[Node]:
    """Adjacent literals as one (`"*** Begin Patch"`, not one literal per character)."""
    out: list[Node] = []
    for item in items:
        if isinstance(item, Lit) and out and isinstance(out[-1], Lit):
            out[-1] = Lit(out[-1].text + item.text)
        else:
            out.append(item)
    return out


def _subtract(ranges: Ranges, holes: Ranges) -> Ranges:
    """`ranges` without the code points in `holes`."""
    out = list(ranges)
    for h_lo, h_hi in holes:
        nxt = []
        for a, b in out:
            if b < h_lo or a > h_hi:
                nxt.append((a, b))
                continue
            if a < h_lo:
                nxt.append((a, h_lo - 1))
            if b > h_hi:
                nxt.append((h_hi + 1, b))
        out = nxt
    return merged(out)
