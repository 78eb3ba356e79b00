"""Reading GBNF text: a parser that follows llama.cpp's (src/llama-grammar.cpp).

A grammar a client writes (`guided_grammar`, SGLang's `ebnf`) is read here first, so that
one llama.cpp cannot read is refused with a 400 naming the client's field (the engine's
own refusal can only name `grammar`), and one in another EBNF flavour (Lark's
`start: ...`, ISO EBNF's `rule = ... ;`) is named as such. The tree it returns is also
what the tests' grammar matcher walks (tests/helpers/gbnf_match.py).

The tree: a rule is an `Alt` (a tuple of sequences, each a tuple of items); an item is
`Lit(text)`, `Class(negated, ranges)`, `Any()`, `Ref(name)`, `Token(text)` (llama.cpp's
`<...>` token references), a nested `Alt` (a group) or `Rep(item, low, high)`.
"""

from __future__ import annotations

from dataclasses import dataclass


class GbnfError(ValueError):
    """The text is not a grammar llama.cpp reads."""


@dataclass(frozen=True, slots=True)
class Lit:
    text: str


@dataclass(frozen=True, slots=True)
class Class:
    negated: bool
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Any_:
    pass


@dataclass(frozen=True, slots=True)
class Ref:
    name: str


@dataclass(frozen=True, slots=True)
class Token:
    text: str


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[tuple[Item, ...], ...]


@dataclass(frozen=True, slots=True)
class Rep:
    item: Item
    low: int
    high: int | None


Item = Lit | Class | Any_ | Ref | Token | Alt | Rep
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX = {"x": 2, "u": 4, "U": 8}


def _word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "-")


class _Reader:
    def __init__(self, text: str):
        self.src = text
        self.i = 0

    def fail(self, what: str) -> GbnfError:
        line = self.src.count("\n", 0, self.i) + 1
        return GbnfError(f"{what} at line {line}: {self.src[self.i : self.i + 20]!r}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def space(self, newlines: bool) -> None:
        while (ch := self.peek()) and (ch in " \t#" or (newlines and ch in "\r\n")):
            if ch == "#":
                while self.peek() and self.peek() not in "\r\n":
                    self.i += 1
            else:
                self.i += 1

    def name(self) -> str:
        start = self.i
        while _word(self.peek()):
            self.i += 1
        if self.i == start:
            raise self.fail("expecting a name")
        return self.src[start : self.i]

    def char(self) -> str:
        ch = self.peek()
        if not ch:
            raise self.fail("unexpected end of input")
        self.i += 1
        if ch != "\\":
            return ch
        esc = self.peek()
        self.i += 1
        if esc in _ESCAPES:
            return _ESCAPES[esc]
        if esc in _HEX:
            digits = self.src[self.i : self.i + _HEX[esc]]
            try:
                value = int(digits, 16)
            except ValueError:
                raise self.fail("expecting hex digits") from None
            self.i += _HEX[esc]
            return chr(value) if value < 0x110000 else "\ufffd"
        raise self.fail(f"unknown escape '\\{esc}'")

    def int_(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if self.i == start:
            raise self.fail("expecting an int")
        return int(self.src[start : self.i])

    def alternates(self, nested: bool) -> Alt:
        options = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            options.append(self.sequence(nested))
        return Alt(tuple(options))

    def sequence(self, nested: bool) -> tuple[Item, ...]:
        items: list[Item] = []
        while ch := self.peek():
            if ch == '"':
                self.i += 1
                text = []
                while self.peek() != '"':
                    text.append(self.char())
                self.i += 1
                items.append(Lit("".join(text)))
            elif ch == "[":
                items.append(self.char_class())
            elif ch in "<!":
                negated = ch == "!"
                self.i += 1 if negated else 0
                end = self.src.find(">", self.i)
                if self.peek() != "<" or end < 0:
                    raise self.fail("expecting a token <...>")
                items.append(Token(("!" if negated else "") + self.src[self.i : end + 1]))
                self.i = end + 1
            elif _word(ch):
                items.append(Ref(self.name()))
            elif ch == "(":
                self.i += 1
                self.space(True)
                items.append(self.alternates(True))
                if self.peek() != ")":
                    raise self.fail("expecting ')'")
                self.i += 1
            elif ch == ".":
                self.i += 1
                items.append(Any_())
            elif ch in "*+?{":
                if not items:
                    raise self.fail(f"expecting an item before '{ch}'")
                items.append(Rep(items.pop(), *self.repetition()))
            else:
                break
            self.space(nested)
        return tuple(items)

    def char_class(self) -> Class:
        self.i += 1
        negated = self.peek() == "^"
        self.i += negated
        ranges = []
        while self.peek() != "]":
            low = ord(self.char())
            high = low
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                high = ord(self.char())
            ranges.append((low, high))
        self.i += 1
        return Class(negated, tuple(ranges))

    def repetition(self) -> tuple[int, int | None]:
        ch = self.peek()
        self.i += 1
        if ch != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        self.space(False)
        low = self.int_()
        self.space(False)
        high: int | None = low
        if self.peek() == ",":
            self.i += 1
            self.space(False)
            high = self.int_() if self.peek().isdigit() else None
            self.space(False)
        if self.peek() != "}":
            raise self.fail("expecting '}'")
        self.i += 1
        return low, high


def parse_gbnf(text: str, root: str = "root") -> dict[str, Alt]:
    """The rules of a GBNF text; GbnfError if llama.cpp could not read it (a syntax
    error, an undefined rule, no `root` rule), naming another grammar flavour if the
    text looks like one."""
    if "::=" not in text:
        raise GbnfError(
            "not GBNF (llama.cpp's grammar format, rules written `name ::= ...`): "
            "Lark grammars and other EBNF flavours are not read"
        )
    reader = _Reader(text)
    rules: dict[str, Alt] = {}
    reader.space(True)
    while reader.peek():
        name = reader.name()
        reader.space(False)
        if not reader.src.startswith("::=", reader.i):
            raise reader.fail("expecting ::=")
        reader.i += 3
        reader.space(True)
        rules[name] = reader.alternates(False)
        if reader.peek() not in ("\r", "\n", ""):
            raise reader.fail("expecting newline or end")
        reader.space(True)
    if root not in rules:
        raise GbnfError(f"the grammar has no '{root}' rule")
    for name, alt in rules.items():
        for ref in _refs(alt):
            if ref not in rules:
                raise GbnfError(f"rule '{name}' refers to undefined rule '{ref}'")
    return rules


def _refs(item: Item) -> list[str]:
    if isinstance(item, Ref):
        return [item.name]
    if isinstance(item, Rep):
        return _refs(item.item)
    if isinstance(item, Alt):
        return [r for seq in item.options for part in seq for r in _refs(part)]
    return []
