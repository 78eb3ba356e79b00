"""Lark / regex custom-tool grammars -> GBNF for the JSON text of the input string
(chat/lark.py, chat/regex.py, chat/textgrammar.py), checked by matching real inputs:
the GBNF the converter writes is turned into a Python regex (the grammars here are not
recursive) and must match the JSON text of every sentence, and of nothing else."""

from __future__ import annotations

import json
import re

import pytest

from chat.gbnf import RuleSet
from chat.lark import lark_to_gbnf, parse_lark, tool_input_gbnf
from chat.textgrammar import TextGrammarError

# Codex's apply_patch grammar (openai/codex, codex-rs/core/src/tools/handlers/
# tool_apply_patch.lark), as Codex sends it in the custom tool's format.definition.
APPLY_PATCH = """start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
# Codex 0.171's `exec` custom tool (captured from its request).
EXEC = ("\nstart: pragma_source | plain_source\npragma_source: PRAGMA_LINE NEWLINE SOURCE\n"
        "plain_source: SOURCE\n\nPRAGMA_LINE: /[ \\t]*\\/\\/ @exec:[^\\r\\n]*/\n"
        "NEWLINE: /\\r?\\n/\nSOURCE: /[\\s\\S]+/\n")  # fmt: skip

PATCH = """*** Begin Patch
*** Add File: hello.txt
+print("Hello, \\\\world\\t!")
+
*** Update File: src/app.py
*** Move to: src/main.py
@@ def greet():
-print("Hi")
+print("Hello, world!")
*** End of File
*** Delete File: obsolete.txt
*** End Patch
"""

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[a-z0-9-]+|[()|*+?]|\{\d*,?\d*\}|\s+')
_LITERAL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"'}


def _literal(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            ch = body[i + 1]
            if ch in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[ch]
                out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
                i += 2 + width
                continue
            out.append(_LITERAL_ESCAPES[ch])
            i += 2
            continue
        out.append(body[i])
        i += 1
    return re.escape("".join(out))


def gbnf_regex(text: str) -> str:
    """A non-recursive GBNF grammar (as chat/ writes them) as a Python regex."""
    rules = dict(line.split(" ::= ", 1) for line in text.strip().split("\n"))

    def expr(body: str, depth: int) -> str:
        assert depth < 50, "recursive grammar"
        out = []
        for tok in _TOKEN.findall(body):
            if tok.isspace():
                continue
            if tok.startswith('"'):
                out.append(_literal(tok[1:-1]))
            elif tok.startswith("[") or tok in "()|*+?" or tok.startswith("{"):
                out.append(tok)  # classes and operators read the same in Python's re
            else:
                out.append(f"(?:{expr(rules[tok], depth + 1)})")
        return "".join(out)

    return expr(rules["root"], 0)


def matcher(syntax: str, definition: str) -> re.Pattern[str]:
    rules = RuleSet()
    root = tool_input_gbnf(syntax, definition, rules, "t0-")
    return re.compile(gbnf_regex(rules.text(root)), re.DOTALL)


def accepts(pattern: re.Pattern[str], text: str) -> bool:
    """Whether the JSON text of the string `text` matches."""
    return pattern.fullmatch(json.dumps(text, ensure_ascii=False)[1:-1]) is not None


def test_apply_patch_grammar_takes_real_patches_and_nothing_else() -> None:
    grammar = matcher("lark", APPLY_PATCH)
    assert accepts(grammar, PATCH)  # quotes, backslashes, tabs and empty lines included
    assert accepts(grammar, PATCH.removesuffix("\n"))  # the last LF is optional
    assert not accepts(grammar, PATCH.replace("*** End Patch\n", ""))
    assert not accepts(grammar, "*** Begin Patch\n*** End Patch\n")  # hunk+: one at least
    assert not accepts(grammar, PATCH.replace("+print", "print", 1))  # an add line needs '+'
    assert not accepts(grammar, "*** Begin Patch\n*** Add File: \n+x\n*** End Patch\n")
    # the raw text (unescaped newlines, a bare quote) is not the JSON text of the string
    assert grammar.fullmatch(PATCH) is None


def test_codex_exec_grammar() -> None:
    grammar = matcher("lark", EXEC)
    assert accepts(grammar, "// @exec: {\"timeout\": 5}\nawait tools.exec_command({cmd: 'ls'})\n")
    assert accepts(grammar, "const a = \"\\\\\";\r\n\tconsole.log(a)")
    assert not accepts(grammar, "")


def test_lark_features() -> None:
    source = """
    // a comment
    start: item ("," item)* [";"]   # another comment
    ?item: WORD | NUMBER | "x"i
         | "a".."c" ~ 2..3
    _SECRET.2: "never used"
    %import common (WORD, NUMBER)
    %import common.WS -> SPACE
    %ignore SPACE
    """
    grammar = matcher("lark", source)
    for good in ("abc", "abc, 12.5e3 ,X", "ab;", " bca , x ;  ", "hello,42"):
        assert accepts(grammar, good), good
    for bad in ("", "abc,", "abcd1", "abc d", "d;;"):
        assert not accepts(grammar, bad), bad
    assert "_SECRET" not in parse_lark(source).rules  # unused rules are left out


def test_regex_format_is_a_whole_match() -> None:
    grammar = matcher("regex", r"^(?:[a-z]+|\d{2,3})\.(txt|md)$")
    assert accepts(grammar, "notes.md") and accepts(grammar, "123.txt")
    assert not accepts(grammar, "x notes.md") and not accepts(grammar, "1.txt")
    quoted = matcher("regex", r'say "[^"]*"\n?')
    assert accepts(quoted, 'say "hi"\n') and not accepts(quoted, 'say "a"b"')
    nocase = matcher("lark", 'start: /yes|no/i "!"')
    assert accepts(nocase, "YeS!") and not accepts(nocase, "nope!")


REFUSED = [
    ("start: a\na: a \"x\" | \"y\"", "left recursion"),
    ("start: b\nb: c\nc: b \"x\"", "left recursion"),
    ("start: missing", "not defined"),
    ("a: \"x\"", "no 'start'"),
    ("start: /(?=x)x/", "lookaround"),
    ("start: /(a)\\1/", "escape"),
    ("start: _sep{x, y}", "templates"),
    ("%declare X\nstart: X", "directive"),
    ("start: \"x\"\nstart: \"y\"", "twice"),
    ("start: \"b\"..\"a\"", "range"),
    ("%import other.X\nstart: X", "common"),
    ("start: @", "cannot read"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "said"), REFUSED)
def test_grammars_kvserve_cannot_take_are_refused(source: str, said: str) -> None:
    with pytest.raises(TextGrammarError, match=said):
        lark_to_gbnf(source, RuleSet(), "t-")


def test_recursion_that_is_not_left_recursion_is_kept() -> None:
    rules = RuleSet()
    root = lark_to_gbnf('start: "(" start ")" | "x"', rules, "t-")
    assert root in rules.text(root).split("\n")[1]  # the rule refers to itself
