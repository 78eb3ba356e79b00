"""A custom tool's grammar (`format: {type: "grammar", syntax: "lark" | "regex"}`) -> GBNF
for its input string: the JSON text of the string (JSON call formats) or the raw text
(Qwen3-Coder's XML parameters), chat/textgrammar.py's two writers.

Lark (https://lark-parser.readthedocs.io/en/latest/grammar.html), the subset grammars
for tools use: rules and terminals (`name: ...`, `NAME: ...`, priorities and the `_ ? !`
modifiers read and dropped), alternatives over several lines, aliases (`-> name`,
dropped), strings (`"..."`, `"..."i`), character ranges (`"a".."z"`), regexes
(`/.../flags`, chat/regex.py), groups, `[optional]`, `? * +`, `~ n` and `~ n..m`,
`%import common.NAME` (one or a list, with `-> alias`), `%ignore` (allowed between the
items of a rule, as Lark's lexer skips it between tokens) and `//` or `#` comments.
The grammar is taken as the context-free grammar it writes: Lark's lexer (longest match,
terminal priorities) is not modelled, so the constraint may allow a few strings Lark's
parser would refuse, never refuse one of its sentences. Refused (TextGrammarError): rule
templates, `%declare`, `%override`, `%extend`, llguidance's extensions, undefined names,
and left recursion (llama.cpp's grammars cannot hold it; write it as a repetition).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chat.gbnf import RuleSet
from chat.lark_rules import IGNORE, check_left_recursion, reachable, with_ignore
from chat.regex import parse_regex
from chat.textgrammar import (
    Alt,
    Chars,
    Lit,
    Node,
    Ref,
    Rep,
    Seq,
    TextGrammarError,
    no_case,
    writer,
)

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\f\r]+|\\\n)|(?P<comment>(?://|\#)[^\n]*)|(?P<nl>\n)
    |(?P<string>"(?:[^"\\\n]|\\.)*"i?)|(?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
    |(?P<directive>%[a-z]+)|(?P<name>[_?!]?[A-Za-z_][A-Za-z0-9_]*)|(?P<number>[0-9]+)
    |(?P<op>\.\.|->|[:|()\[\]?*+~.,{}<>])""",
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    line: int


def _tokens(source: str) -> list[_Tok]:
    out, at, line = [], 0, 1
    while at < len(source):
        m = _TOKEN.match(source, at)
        if m is None:
            raise TextGrammarError(f"lark grammar, line {line}: cannot read {source[at:at + 20]!r}")
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            out.append(_Tok(kind, m.group(), line))
        line += m.group().count("\n")
        at = m.end()
    return out


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "\\": "\\",
            '"': '"', "'": "'"}  # fmt: skip


def _unquote(body: str) -> str:
    """A Lark string literal's text (its escapes are Python's)."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            width = {"x": 2, "u": 4, "U": 8}.get(nxt)
            if width and re.fullmatch(r"[0-9a-fA-F]+", body[i + 2 : i + 2 + width] or "-"):
                out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
                i += 2 + width
                continue
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# Lark's common.lark, as far as tools use it (ESCAPED_STRING without its lookbehind).
COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\\n]/ | "\\" /./)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /(.|\n)*?/ "*/"
SQL_COMMENT: /--[^\n]*/
"""


class _Parser:
    def __init__(self, source: str, scope: str = ""):
        self.toks = _tokens(source)
        self.i = 0
        self.depth = 0  # inside () or []: newlines are only layout
        self.scope = scope  # names of an imported grammar are prefixed with it
        self.rules: dict[str, Node] = {}
        self.ignore: list[Node] = []

    def error(self, what: str) -> TextGrammarError:
        tok = self.toks[min(self.i, len(self.toks) - 1)] if self.toks else None
        return TextGrammarError(f"lark grammar, line {tok.line if tok else 1}: {what}")

    def peek(self, skip_nl: bool = False) -> _Tok | None:
        j = self.i
        while skip_nl and j < len(self.toks) and self.toks[j].kind == "nl":
            j += 1
        return self.toks[j] if j < len(self.toks) else None

    def take(self, text: str | None = None) -> _Tok:
        if self.depth:
            while self.i < len(self.toks) and self.toks[self.i].kind == "nl":
                self.i += 1
        tok = self.peek()
        if tok is None or (text is not None and tok.text != text):
            raise self.error(f"expected {text or 'more'}, found {tok.text if tok else 'the end'}")
        self.i += 1
        return tok

    def grammar(self) -> None:
        while (tok := self.peek()) is not None:
            if tok.kind == "nl":
                self.i += 1
            elif tok.kind == "directive":
                self.directive()
            elif tok.kind == "name":
                self.definition()
            else:
                raise self.error(f"unexpected {tok.text!r}")

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.text == text

    def name(self, text: str) -> str:
        """A name as written, its `?` / `!` tree-shaping modifier dropped."""
        return self.scope + text.lstrip("?!")

    def definition(self) -> None:
        name = self.name(self.take().text)
        if self.at("{"):
            raise self.error("rule templates are not supported")
        if self.at("."):
            self.take(".")
            self.take()  # a priority: the lexer's business, not the language's
        self.take(":")
        if name in self.rules:
            raise self.error(f"'{name}' is defined twice")
        self.rules[name] = self.expansions()

    def expansions(self) -> Node:
        options = [self.alias()]
        while True:
            tok = self.peek(skip_nl=True)
            if tok is None or tok.text != "|":
                break
            while (nl := self.peek()) is not None and nl.kind == "nl":
                self.i += 1
            self.take("|")
            options.append(self.alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self) -> Node:
        items: list[Node] = []
        while (tok := self.peek(skip_nl=self.depth > 0)) is not None:
            if tok.kind == "nl" or tok.text in ("|", ")", "]", "->"):
                break
            items.append(self.item())
        if (tok := self.peek(skip_nl=self.depth > 0)) is not None and tok.text == "->":
            self.take("->")
            self.take()  # the alias names the tree node: no change to the language
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def item(self) -> Node:
        node = self.atom()
        tok = self.peek()
        if tok is not None and tok.text in ("?", "*", "+"):
            self.take()
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[tok.text]
            return Rep(node, low, high)
        if tok is not None and tok.text == "~":
            self.take()
            low = int(self.take().text)
            high = low
            if self.at(".."):
                self.take("..")
                high = int(self.take().text)
            return Rep(node, low, high)
        return node

    def atom(self) -> Node:
        tok = self.take()
        if tok.text in ("(", "["):
            self.depth += 1
            inner = self.expansions()
            self.take(")" if tok.text == "(" else "]")
            self.depth -= 1
            return inner if tok.text == "(" else Rep(inner, 0, 1)
        if tok.kind == "string":
            text = _unquote(tok.text.rstrip("i")[1:-1])
            nxt = self.peek()
            if nxt is not None and nxt.text == "..":
                self.take("..")
                end = self.take()
                high = _unquote(end.text[1:-1]) if end.kind == "string" else ""
                if len(text) != 1 or len(high) != 1 or high < text:
                    raise self.error("a range needs two one-character strings, low to high")
                return Chars(((ord(text), ord(high)),))
            return no_case(text) if tok.text.endswith("i") else Lit(text)
        if tok.kind == "regex":
            body, _, flags = tok.text[1:].rpartition("/")
            return parse_regex(body, flags)
        if tok.kind == "name":
            if self.at("{"):
                raise self.error("rule templates are not supported")
            return Ref(self.name(tok.text))
        raise self.error(f"unexpected {tok.text!r}")

    def directive(self) -> None:
        tok = self.take()
        if tok.text == "%ignore":
            self.ignore.append(self.expansions())
        elif tok.text == "%import":
            self.imports()
        else:
            raise self.error(f"the directive {tok.text} is not supported")

    def imports(self) -> None:
        path = self.take().text
        while self.at("."):
            self.take(".")
            path += "." + self.take().text
        module, _, name = path.rpartition(".")
        if self.at("("):
            module, names = path, []
            self.take("(")
            while self.peek() is not None and not self.at(")"):
                names.append(self.take().text)
                if self.at(","):
                    self.take(",")
            self.take(")")
            pairs = [(n, n) for n in names]
        else:
            alias = name
            if self.at("->"):
                self.take("->")
                alias = self.take().text
            pairs = [(name, alias)]
        if module != "common":
            raise self.error(f"only %import common.<NAME> is supported, not '{module}'")
        for name, alias in pairs:
            if f"common__{name}" not in _common():
                raise self.error(f"common.lark has no '{name}' here")
            self.rules[self.name(alias)] = Ref(f"common__{name}")


_COMMON: dict[str, Node] = {}


def _common() -> dict[str, Node]:
    if not _COMMON:
        parser = _Parser(COMMON, scope="common__")
        parser.grammar()
        _COMMON.update(parser.rules)
    return _COMMON


@dataclass(frozen=True, slots=True)
class LarkGrammar:
    rules: dict[str, Node]  # by name, `start` among them (and IGNORE when set)


def parse_lark(source: str) -> LarkGrammar:
    parser = _Parser(source)
    parser.grammar()
    rules = {**_common(), **parser.rules}
    if "start" not in rules:
        raise TextGrammarError("lark grammar: no 'start' rule")
    if parser.ignore:
        rules = {name: with_ignore(name, body) for name, body in rules.items()}
        rules[IGNORE] = Rep(Alt(tuple(parser.ignore)), 0, None)
        rules["start"] = Seq((Ref(IGNORE), rules["start"], Ref(IGNORE)))
    used = reachable(rules)
    check_left_recursion({n: rules[n] for n in used})
    return LarkGrammar({n: rules[n] for n in rules if n in used})


def lark_to_gbnf(source: str, rules: RuleSet, prefix: str, json_text: bool = True) -> str:
    """The GBNF expression (a rule of `rules`) for `source`'s sentences: their JSON text
    (`json_text`) or the text itself."""
    grammar = parse_lark(source)
    names = {n: rules.reserve(prefix + n.replace("_", "-")) for n in grammar.rules}
    out = writer(rules, prefix, json_text, names)
    for name, body in grammar.rules.items():
        rules.define(names[name], out.expr(body))
    return names["start"]


def tool_input_gbnf(
    syntax: str, definition: str, rules: RuleSet, prefix: str, json_text: bool = True
) -> str:
    """A custom tool's input grammar (`syntax` "lark" or "regex") as a GBNF expression
    for the JSON text of the input string (`json_text`), or for the text itself."""
    if syntax == "lark":
        return lark_to_gbnf(definition, rules, prefix, json_text)
    if syntax == "regex":
        return writer(rules, prefix, json_text).group(parse_regex(definition))
    raise TextGrammarError(f"grammar syntax '{syntax}' is not supported; only lark and regex")
