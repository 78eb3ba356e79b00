"""Past calls' ids on the templates that demand 9 alphanumerics (Mistral Nemo, Small
3.2): the ids clients send back (kvserve's `call_…`, Anthropic's `toolu_…`) render as 9
alphanumerics derived from them, the same on every turn, a call and its result alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chat.call_ids import demands_nine, nine
from tests.chat.test_all_templates import TEMPLATES, conversation, render

DEMANDING = [p for p in TEMPLATES if demands_nine(p.read_text())]


def test_the_mistral_templates_are_the_demanding_ones() -> None:
    assert {p.name for p in DEMANDING} == {
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    }


def with_id(call_id: str) -> list[dict]:
    messages = conversation(None)
    messages[2] = {**messages[2], "tool_calls": [{**messages[2]["tool_calls"][0], "id": call_id}]}
    messages[3] = {**messages[3], "tool_call_id": call_id}
    return messages


@pytest.mark.parametrize("path", DEMANDING, ids=lambda p: p.stem)
@pytest.mark.parametrize("call_id", ["call_" + "x" * 24, "toolu_01ABCdef", "fc-1"])
def test_a_foreign_id_renders_as_nine_alphanumerics(path: Path, call_id: str) -> None:
    text = render(path, with_id(call_id))
    assert call_id not in text
    assert text.count(nine(call_id)) >= 1
    assert re.fullmatch(r"[A-Za-z0-9]{9}", nine(call_id))
    assert render(path, with_id(call_id)) == text  # the same on every turn


def test_nine_keeps_a_conforming_id_and_tells_ids_apart() -> None:
    assert nine("abcDEF123") == "abcDEF123"
    assert nine("call_a") != nine("call_b")
    assert nine("call_a") == nine("call_a")
