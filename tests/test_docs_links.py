"""The README and docs/ link to each other and into the tree: every relative link and image
points at a file that exists, and every #anchor into a Markdown file names a heading there,
by the rules a repository host (GitHub) makes anchors with: the heading's text in lower
case, punctuation dropped, each space a '-', a repeated heading numbered -1, -2, ...

Fenced code blocks and inline code are not prose: a `[x](y)` or a `# comment` inside them
is neither a link nor a heading."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)([^`]+?)\1")  # may run over a line break, as in Markdown
# [text](target) or ![alt](target), an optional "title" after the target; the text may
# hold one level of brackets and run over line breaks.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
MD_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def prose(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lower case, characters other
    than letters, digits, '_', '-' and spaces dropped, each space a '-'."""
    text = MD_LINK_TEXT.sub(r"\1", heading)          # a link's text, not its target
    text = INLINE_CODE.sub(lambda m: m.group(2), text)  # code keeps its characters
    text = text.replace("*", "")                       # emphasis markers are not text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of each link; fenced lines and inline code blanked first, keeping
    every line break, so that a link whose text wraps onto the next line is still found."""
    lines = path.read_text().splitlines()
    kept = dict(prose(path.read_text()))
    text = "\n".join(kept.get(n, "") for n in range(1, len(lines) + 1))
    text = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for match in LINK.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for each relative link of `path` that does not resolve."""
    broken = []
    for number, target in links(path):
        if not target or EXTERNAL.match(target):
            continue
        name, _, anchor = target.partition("#")
        where = f"{path.name}:{number}: {target}"
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where} (no heading '{anchor}' in {linked.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_into_every_docs_page() -> None:
    """The front page is how a reader finds the pages: none is left unlinked."""
    docs = {p.name for p in PAGES if p.parent.name == "docs"}
    assert "README.md" in docs and len(docs) > 5
    linked = {Path(t.partition("#")[0]).name for _, t in links(ROOT / "README.md")
              if t.startswith("docs/")}
    assert docs - linked == set()


# Headings of these docs (and two made up) with the anchors GitHub gives them.
ANCHORS = {
    "Responses API (`POST /v1/responses`)": "responses-api-post-v1responses",
    "Reuse, and exact reuse": "reuse-and-exact-reuse",
    "Against llama-server and llama_cpp.server": "against-llama-server-and-llama_cppserver",
    "Model management in Ollama's shapes": "model-management-in-ollamas-shapes",
    "Calls cut off by `max_tokens`": "calls-cut-off-by-max_tokens",
    "deploy/: the whole stack with docker compose": "deploy-the-whole-stack-with-docker-compose",
    "The [CLI](cli.md) and **more**": "the-cli-and-more",
}


@pytest.mark.parametrize(("heading", "anchor"), ANCHORS.items())
def test_anchors_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[fine](other.md#a-section) [fine too](other.md#a-section-1) [self](#here)\n"
        "![missing image](img/none.png) [gone](missing.md) [bad anchor](other.md#nope)\n"
        "[bad self](#there) [web](https://example.com/x.md#y) `[in code](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n# not a heading\n```\n"
        "[fenced heading](#not-a-heading) [a link whose text\nwraps](gone.md) `a code span\n"
        "that wraps [x](y.md)`\n"
    )
    assert broken_links(page) == [
        "page.md:6: img/none.png (no such file)",
        "page.md:6: missing.md (no such file)",
        "page.md:6: other.md#nope (no heading 'nope' in other.md)",
        "page.md:7: #there (no heading 'there' in page.md)",
        "page.md:12: #not-a-heading (no heading 'not-a-heading' in page.md)",
        "page.md:12: gone.md (no such file)",
    ]
