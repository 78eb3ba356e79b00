"""What the call-format tests ported from llama.cpp's tests/test-chat.cpp share: its
templates (models/templates/, in tests/chat/templates/), a parser case run through a
template's whole plan, a conversation with past calls, and the check that past calls
render as the format's grammar writes them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from chat.callformat import CallFormat
from chat.formats import detect_format
from chat.plan import ChatOptions, plan_chat
from chat.replay import SampledTurn, prompt_digest
from chat.template import ChatTemplate
from chat.tools import Tool, ToolChoice
from tests.chat.gbnf_check import accepts
from tests.chat.parse_run import run

TEMPLATES = Path(__file__).parent / "templates"
HELLO = "Hello, world!\nWhat's up?"
USER = [{"role": "user", "content": "Hi"}]
SPECIAL = [("special_function", {"arg1": 1})]
Calls = list[tuple[str, Any]]  # (name, arguments as JSON values)
# a parser case as a row: (test-chat.cpp's name, template, tools, output, reasoning,
# content, calls); with the thinking switch after the template
Row = tuple[str, str, list[Tool], str, str, str, Calls]
SwitchedRow = tuple[str, str, bool, list[Tool], str, str, str, Calls]
Test = TypeVar("Test", bound=Callable[..., None])


def template(name: str, eos: str = "") -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(), bos_token="", eos_token=eos, add_bos=False)


def detected(name: str) -> CallFormat:
    """The call format detected from the template file `name`."""
    return detect_format((TEMPLATES / name).read_text())


@dataclass(frozen=True)
class ParseCase:
    """A test-chat.cpp parser case: the plan of template `template` (with `tools` and the
    other ChatOptions fields in `options`) reads `text` as its output; llama.cpp's
    message is `reasoning`, `content` (both compared stripped, as its assert_msg_equals
    does) and `calls`."""

    name: str
    template: str
    tools: list[Tool]
    text: str
    reasoning: str
    content: str
    calls: Calls
    options: dict[str, Any] = field(default_factory=dict)
    eos: str = ""

    @classmethod
    def switched(
        cls, keys: tuple[str, ...], name: str, template: str, thinking: bool, tools: list[Tool],
        text: str, reasoning: str, content: str, calls: Calls,
    ) -> ParseCase:  # fmt: skip
        """A case whose thinking is switched on or off by the template variables `keys`."""
        options = {"template_kwargs": dict.fromkeys(keys, thinking)}
        return cls(name, template, tools, text, reasoning, content, calls, options)

    @classmethod
    def row(
        cls, name: str, template: str, tools: list[Tool], text: str, reasoning: str,
        content: str, calls: Calls, reasoning_format: str = "auto", eos: str = "",
    ) -> ParseCase:  # fmt: skip
        """A case as the format tests write it: a row, with the `reasoning_format` asked."""
        options = {"reasoning_format": reasoning_format}
        return cls(name, template, tools, text, reasoning, content, calls, options, eos)

    def check(self, step: int) -> None:
        """The plan's parser, fed `step` characters at a time, reads llama.cpp's message."""
        opts = ChatOptions(tools=tuple(self.tools), **self.options)
        plan = plan_chat(template(self.template, self.eos), USER, opts)
        got = run(plan.parser(), self.text, step)
        assert got["reasoning_content"].strip() == self.reasoning
        assert got["content"].strip() == self.content
        assert got["tool_calls"] == self.calls


def cases(
    template: str | None, rows: list[tuple[Any, ...]], eos: str = "", **options: Any
) -> list[ParseCase]:
    """Parser cases from rows (test-chat.cpp's name, tools, output, reasoning, content,
    calls[, reasoning_format]) of template `template`; None: each row names its template
    after the case's name. `options`: ChatOptions fields every row's plan takes."""
    named = rows if template is None else [(row[0], template, *row[1:]) for row in rows]
    made = [ParseCase.row(*row) for row in named]
    return [replace(c, eos=eos, options={**c.options, **options}) for c in made]


def each_case(cases: list[ParseCase], steps: tuple[int, ...]) -> Callable[[Test], Test]:
    """Parametrizes a test by `cases` (their names as ids) and by `steps` (how many
    characters the parser is fed at a time)."""

    def mark(test: Test) -> Test:
        by_case = pytest.mark.parametrize("case", cases, ids=[c.name for c in cases])(test)
        return pytest.mark.parametrize("step", steps)(by_case)

    return mark


def parser_test(cases: list[ParseCase], steps: tuple[int, ...]) -> Callable[..., None]:
    """The test that the plan's parser reads each of `cases` as llama.cpp does, fed each of
    `steps` characters at a time (`ParseCase.check`); a test module names it `test_...`."""

    @each_case(cases, steps)
    def test(case: ParseCase, step: int) -> None:
        case.check(step)

    return test


def past_calls(
    calls: list[tuple[str, str, str]], user: str = "Run it", ids: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """A conversation in which the assistant made `calls` (name, arguments JSON, result),
    with call ids `ids` (c1, c2, ... by default), and each result came back."""
    ids = ids or tuple(f"c{n}" for n in range(1, len(calls) + 1))
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args, _) in zip(ids, calls, strict=True)]},
        *({"role": "tool", "tool_call_id": i, "content": result}
          for i, (_, _, result) in zip(ids, calls, strict=True)),
    ]  # fmt: skip


def assert_renders(
    name: str, messages: list[dict[str, Any]], tools: tuple[Tool, ...], rendered: str,
    fmt: CallFormat, eos: str = "",
) -> str:  # fmt: skip
    """The prompt of template `name` for `messages` holds `rendered` (the past calls as the
    template writes them), which `fmt`'s required grammar accepts: a call sampled and
    sent back renders to the text it was sampled as. Returns the prompt."""
    text = plan_chat(template(name, eos), messages, ChatOptions(tools=tools)).prompt.text
    assert rendered in text
    assert accepts(fmt.grammar(list(tools), ToolChoice("required"), True).gbnf, rendered)
    return text


class Replayed(NamedTuple):
    """The prompts before (`first`) and after (`second`) a sampled call turn came back,
    and the conversation the second renders (`history`)."""

    first: str
    second: str
    history: list[dict[str, Any]]


def replayed(
    name: str, tools: tuple[Tool, ...], sampled: str, calls: list[tuple[str, str, str]],
    eos: str = "", ids: tuple[str, ...] = (),
) -> Replayed:  # fmt: skip
    """Template `name`'s prompt for USER (with `tools`), then its prompt once the turn
    sampled after it as `sampled` (its calls and their results `calls`, ids `ids`: see
    `past_calls`) comes back with the replay of chat/replay.py."""
    opts = ChatOptions(tools=tools)
    first = plan_chat(template(name, eos), USER, opts).prompt.text
    turn = SampledTurn(sampled, prompt_digest(first))
    history = [*USER, *past_calls(calls, ids=ids)[1:]]
    second = plan_chat(template(name, eos), history, opts, lambda m: [turn]).prompt.text
    return Replayed(first, second, history)


def required_accepts(fmt: CallFormat, tools: list[Tool], text: str) -> bool:
    """Whether `fmt`'s grammar under `tool_choice: required` (parallel calls on), which is
    never lazy, accepts `text`."""
    spec = fmt.grammar(list(tools), ToolChoice("required"), parallel=True)
    assert not spec.lazy
    return accepts(spec.gbnf, text)


def truncated(name: str, tools: list[Tool], text: str) -> int:
    """How many calls the parser of template `name`'s plan (with `tools`) counts cut off
    when the output ends after `text`."""
    parser = plan_chat(template(name), USER, ChatOptions(tools=tuple(tools))).parser()
    parser.feed(text)
    parser.finish()
    return parser.num_truncated
