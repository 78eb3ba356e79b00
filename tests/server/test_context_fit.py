"""Which turns `context_overflow = "drop_oldest"` drops (no model)."""

from __future__ import annotations

from server.serving.context_fit import drop_oldest_turn


def m(role: str, text: str = "") -> dict:
    return {"role": role, "content": text or role}


def test_the_oldest_turn_after_the_system_messages_goes_whole() -> None:
    calls = {**m("assistant"), "tool_calls": [{"id": "c1"}]}
    messages = [m("system"), m("user", "u1"), calls, m("tool"), m("assistant", "a1"),
                m("user", "u2"), m("assistant", "a2"), m("user", "u3")]  # fmt: skip
    once = drop_oldest_turn(messages)
    assert once == [m("system"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")]
    twice = drop_oldest_turn(once or [])
    assert twice == [m("system"), m("user", "u3")]
    assert drop_oldest_turn(twice or []) is None  # the last turn always stays


def test_without_a_system_message() -> None:
    assert drop_oldest_turn([m("user", "u1"), m("user", "u2")]) == [m("user", "u2")]
    assert drop_oldest_turn([m("user", "u1")]) is None
