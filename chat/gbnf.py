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


def repeat(item: str, low: int, high: int | None) -> str:
    """`item` repeated low..high times (high None: unbounded)."""
    if high is None:
        return f"({item}){{{low},}}" if low else f"({item})*"
    if low == high == 1:
        return item
    return f"({item}){{{low},{high}}}"


class RuleSet:
    """An ordered table of named rules; identical bodies share one name."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}

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

    def text(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items() if name != "root"]
        return "\n".join(lines) + "\n"
