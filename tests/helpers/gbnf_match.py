"""Whether a GBNF grammar accepts a whole text: a small recognizer over chat.gbnf_read's
tree, so that unit tests can check grammars against instances without a model (the real
llama.cpp checks them in tests/integration/test_structured.py). Token references
(`<...>`) match nothing here."""

from __future__ import annotations

from chat.gbnf_read import Alt, Any_, Class, Item, Lit, Ref, Rep, parse_gbnf


def accepts(grammar: str, text: str) -> bool:
    rules = parse_gbnf(grammar)
    memo: dict[tuple[str, int], frozenset[int]] = {}

    def ends(item: Item, i: int) -> frozenset[int]:
        """Every position where a match of `item` starting at `i` may end."""
        if isinstance(item, Lit):
            return frozenset({i + len(item.text)}) if text.startswith(item.text, i) else frozenset()
        if isinstance(item, Class):
            if i >= len(text):
                return frozenset()
            inside = any(lo <= ord(text[i]) <= hi for lo, hi in item.ranges)
            return frozenset({i + 1}) if inside != item.negated else frozenset()
        if isinstance(item, Any_):
            return frozenset({i + 1}) if i < len(text) else frozenset()
        if isinstance(item, Ref):
            key = (item.name, i)
            if key not in memo:
                memo[key] = frozenset()  # a left-recursive path matches nothing
                memo[key] = ends(rules[item.name], i)
            return memo[key]
        if isinstance(item, Alt):
            out: set[int] = set()
            for seq in item.options:
                positions = {i}
                for part in seq:
                    positions = {e for p in positions for e in ends(part, p)}
                out |= positions
            return frozenset(out)
        if isinstance(item, Rep):
            return repeated(item, i)
        return frozenset()  # a token reference

    def repeated(item: Rep, i: int) -> frozenset[int]:
        current, out, count = {i}, set(), 0
        while True:
            if count >= item.low:
                out |= current
            if item.high is not None and count == item.high:
                break
            nxt = {e for p in current for e in ends(item.item, p)}
            if count >= item.low:
                nxt -= out  # past the minimum only new positions matter
            if not nxt:
                break
            current, count = nxt, count + 1
        return frozenset(out)

    return len(text) in ends(Ref("root"), 0)
