"""What chat/lark.py does with a parsed Lark grammar's rules before they become GBNF:
`%ignore` made explicit between a rule's items, the rules `start` reaches, and the check
for left recursion (llama.cpp's grammar parser refuses it, so it is a 400 here rather
than a failure when the sampler is built)."""

from __future__ import annotations

from chat.textgrammar import Alt, Chars, Lit, Node, Ref, Rep, Seq, TextGrammarError

IGNORE = "%ignore"  # the rule name of what %ignore allows (no grammar name has a '%')


def _is_rule(name: str) -> bool:
    """A rule (lowercase), not a terminal: Lark skips %ignore between a rule's items."""
    return not name.startswith("common__") and name.lstrip("_")[:1].islower()


def with_ignore(name: str, body: Node) -> Node:
    if not _is_rule(name):
        return body
    gap = Ref(IGNORE)

    def walk(node: Node) -> Node:
        if isinstance(node, Seq):
            items: list[Node] = []
            for item in node.items:
                items += [gap, walk(item)] if items else [walk(item)]
            return Seq(tuple(items))
        if isinstance(node, Alt):
            return Alt(tuple(walk(o) for o in node.options))
        if isinstance(node, Rep):  # x+ -> x (gap x)*: the gap between repetitions
            item = walk(node.item)
            more = Rep(Seq((gap, item)), max(node.low - 1, 0),
                       None if node.high is None else node.high - 1)  # fmt: skip
            whole = Seq((item, more))
            return whole if node.low else Rep(whole, 0, 1)
        return node

    return walk(body)


def _refs(node: Node) -> list[str]:
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Seq | Alt):
        children = node.items if isinstance(node, Seq) else node.options
        return [r for c in children for r in _refs(c)]
    if isinstance(node, Rep):
        return _refs(node.item)
    return []


def reachable(rules: dict[str, Node]) -> set[str]:
    seen, todo = set(), ["start"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in rules:
            raise TextGrammarError(f"lark grammar: '{name}' is used but not defined")
        seen.add(name)
        todo += _refs(rules[name])
    return seen


def _nullable(node: Node, null: set[str]) -> bool:
    if isinstance(node, Lit):
        return not node.text
    if isinstance(node, Chars):
        return False
    if isinstance(node, Seq):
        return all(_nullable(i, null) for i in node.items)
    if isinstance(node, Alt):
        return any(_nullable(o, null) for o in node.options)
    if isinstance(node, Rep):
        return node.low == 0 or _nullable(node.item, null)
    return node.name in null


def _leftmost(node: Node, null: set[str]) -> list[str]:
    """The rules that may come first in a sentence of `node`."""
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Alt):
        return [r for o in node.options for r in _leftmost(o, null)]
    if isinstance(node, Rep):
        return _leftmost(node.item, null)
    if isinstance(node, Seq):
        out = []
        for item in node.items:
            out += _leftmost(item, null)
            if not _nullable(item, null):
                break
        return out
    return []


def check_left_recursion(rules: dict[str, Node]) -> None:
    null: set[str] = set()
    while True:  # the nullable rules, to a fixed point
        more = {n for n, body in rules.items() if n not in null and _nullable(body, null)}
        if not more:
            break
        null |= more
    first = {n: set(_leftmost(body, null)) for n, body in rules.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(first[name]):
            if state.get(nxt) == 1:
                cycle = " -> ".join([*path[path.index(nxt):], nxt])
                raise TextGrammarError(f"lark grammar: left recursion ({cycle}) is not "
                                       "supported; write it as a repetition")  # fmt: skip
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(rules):
        if name not in state:
            visit(name, [name])
