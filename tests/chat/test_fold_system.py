"""A system message past the conversation's head, on templates that refuse one there:
folded into a user turn instead of a 400 (Claude Code sends its environment block as a
system message after the first user message, on every request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat.plan import ChatOptions, fold_late_system, plan_chat
from chat.template import ChatTemplate, TemplateRefusal

TEMPLATES = Path(__file__).parent / "templates"
REFUSING = ["google-gemma-2-2b-it.jinja", "Qwen3.5-4B.jinja",
            "mistralai-Mistral-Nemo-Instruct-2407.jinja", "Apertus-8B-Instruct.jinja"]  # fmt: skip


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(), bos_token="<s>", eos_token="</s>",
                        add_bos=False)  # fmt: skip


def test_a_late_system_message_joins_the_user_turn_before_it() -> None:
    messages = [{"role": "system", "content": "Head."}, {"role": "user", "content": "Hi"},
                {"role": "system", "content": "Env."}, {"role": "assistant", "content": "Yo"},
                {"role": "user", "content": "More"}]  # fmt: skip
    assert fold_late_system(messages) == [
        {"role": "system", "content": "Head."}, {"role": "user", "content": "Hi\n\nEnv."},
        {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "More"}]  # fmt: skip
    assert messages[1]["content"] == "Hi"  # the caller's list is left as it was


def test_with_no_user_turn_before_it_joins_the_one_after() -> None:
    messages = [{"role": "assistant", "content": "Yo"}, {"role": "system", "content": "Env."},
                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert fold_late_system(messages) == [
        {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "Env.\n\nHi"}]


def test_nothing_to_fold() -> None:
    assert fold_late_system([{"role": "system", "content": "Head."},
                             {"role": "user", "content": "Hi"}]) is None  # fmt: skip
    parts = [{"role": "user", "content": "Hi"}, {"role": "system", "content": [{"x": 1}]}]
    assert fold_late_system(parts) is None


@pytest.mark.parametrize("name", REFUSING)
def test_refusing_templates_render_claude_codes_turns_with_a_stable_head(name: str) -> None:
    turn1 = [{"role": "user", "content": "Fix the bug."},
             {"role": "system", "content": "<env>cwd: /work</env>"}]  # fmt: skip
    turn2 = [*turn1, {"role": "assistant", "content": "Which file?"},
             {"role": "user", "content": "main.py"}]  # fmt: skip
    with pytest.raises(TemplateRefusal):
        template(name).render(turn2, add_generation_prompt=True)
    first = plan_chat(template(name), turn1, ChatOptions()).prompt.text
    second = plan_chat(template(name), turn2, ChatOptions()).prompt.text
    assert "<env>cwd: /work</env>" in first and "Fix the bug." in first
    # the folded text stays where it was: turn 2's prompt extends turn 1's user turn
    cut = first.index("<env>cwd: /work</env>") + len("<env>cwd: /work</env>")
    assert second.startswith(first[:cut])
