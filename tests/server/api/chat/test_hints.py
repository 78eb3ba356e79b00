"""Chat fields that change nothing here are accepted and logged; those that would change
the answer and are not implemented are a 400 naming them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.api.test_openai_api import MODEL, assert_error


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **extra}


@pytest.mark.parametrize("extra", [
    {"metadata": {"session": "abc"}},
    {"prompt_cache_key": "conversation-1"},
    {"safety_identifier": "user-1"},
    {"store": False},
])  # fmt: skip
async def test_hints_are_accepted(client: httpx.AsyncClient, extra: dict[str, Any],
                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="kvserve.server")
    r = await client.post("/v1/chat/completions", json=chat(**extra))
    assert r.status_code == 200, r.text
    if extra != {"store": False}:
        assert any(next(iter(extra)) in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(("extra", "param"), [
    ({"store": True}, "store"),
    ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ({"audio": {"voice": "alloy"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
])  # fmt: skip
async def test_fields_that_change_the_answer_are_refused(
    client: httpx.AsyncClient, extra: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/v1/chat/completions", json=chat(**extra)), 400, param)
