"""Building GBNF text (llama.cpp's grammar format): rule table, literals, JSON primitives.

Every value rule is "tight" (no surrounding whitespace); composites put the bounded
`ws` rule between tokens. Whitespace and number digits are bounded so that a small model
sampling at a high temperature cannot loop forever inside a structurally valid prefix.
"""

from __future__ import annotations

import json
import re

# Primitives shared by every JSON grammar (added on demand by name).
PRIMITIVES: dict[str, str] = {
    "ws": "[ \\n]?",  # one character: small models otherwise spend tokens on blanks
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\""',
    # Integer part up to 16 digits, fraction and exponent bounded too (see module doc).
    "integer": '"-"? ("0" | [1-9] [0-9]{0,15})',
    "number": 'integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws (string ws ":" ws value (ws "," ws string ws ":" ws value)*)? ws "}"',
    "array": '"[" ws (value (ws "," ws value)*)? ws "]"',
    "date": '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
    '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
    "uuid": '[0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}',
}
# Which primitives each primitive uses, so that adding one adds its dependencies.
_DEPS: dict[str, tuple[str, ...]] = {
    "string": ("char",),
    "number": ("integer",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("ws", "string", "value"),
    "array": ("ws", "value"),
}


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_literal(value: object) -> str:
    """A literal matching the compact JSON text of `value`."""
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


# Bounded repetitions: `x{m,n}` is not a counter in llama.cpp's grammar but a chain of
# rules written out when the grammar is parsed (llama-grammar.cpp: n optional rules for
# x{0,n}, m copies for x{m,}), once per request's sampler. Measured (vocab-only model,
# this build): x{0,1000} 0.26 ms, x{0,2000} 0.6 ms; 20 such 1000-bounds in one grammar
# 8 ms, 100 of them 30 ms. The same parser refuses a lower bound past 2000 and turns an
# upper bound past 2000 into `*` on its own (MAX_REPETITION_THRESHOLD), and the engine
# (engine/grammar.py) refuses a grammar whose bounds sum past 100,000. Schemas carry
# bounds far past these (Claude Code's tools: maxLength 524288), so:
MAX_BOUND = 1000  # one repetition: a bound past this is dropped (see `bounds`)
MAX_TOTAL = 20_000  # one grammar: once its bounds sum past this, further ones are dropped


def bounds(low: int, high: int | None, spent: int = 0) -> tuple[int, int | None]:
    """The repetition written for "low..high times" (high None: unbounded), given the
    bounds the grammar already holds (`spent`). The one rule for every converter: an
    upper bound past the limits becomes unbounded, and so does a lower bound past them
    (kept as "at least one" where it was positive). The output keeps the value's shape;
    only a length or count too large to write out goes unenforced."""
    if high is not None and (high > MAX_BOUND or spent + high > MAX_TOTAL):
        high = None
    if low > MAX_BOUND or spent + low > MAX_TOTAL:
        low = min(low, 1)
    return low, high


# A rule name, a literal or a character class: one symbol, repeated without a group.
_ONE_SYMBOL = re.compile(r'[a-zA-Z0-9-]+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')


class RuleSet:
    """An ordered table of named rules; identical bodies share one name."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self.spent = 0  # the bounds of the repetitions written so far (see `bounds`)

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for dep in _DEPS.get(name, ()):
                self.primitive(dep)
        return name

    def reserve(self, base: str) -> str:
        """A fresh rule name (for recursive rules whose body comes later)."""
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-").lower() or "r"
        candidate, i = name, 1
        while candidate in self.rules or candidate in PRIMITIVES:
            i += 1
            candidate = f"{name}-{i}"
        self.rules[candidate] = ""
        return candidate

    def define(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def add(self, base: str, body: str) -> str:
        """A rule with `body`, reusing an existing one with the same body."""
        if body in self._by_body:
            return self._by_body[body]
        name = self.define(self.reserve(base), body)
        self._by_body[body] = name
        return name

    def repeat(self, base: str, item: str, low: int, high: int | None) -> str:
        """`item` repeated low..high times (high None: unbounded) within `bounds`, counted
        in `spent`: every repetition a converter writes comes here. A compound item
        becomes a rule of its own first: llama.cpp then expands one rule reference, whereas
        a group's expansion is multiplied by the rules inside it (and refused past 2000)."""
        low, high = bounds(low, high, self.spent)
        self.spent += max(low, high or 0)
        if high == 0:
            return '""'
        if not _ONE_SYMBOL.fullmatch(item):
            item = self.add(base, item)
        if high is None:
            return f"{item}{{{low},}}" if low > 1 else f"{item}+" if low else f"{item}*"
        return item if low == high == 1 else f"{item}{{{low},{high}}}"

    def text(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items() if name != "root"]
        return "\n".join(lines) + "\n"
