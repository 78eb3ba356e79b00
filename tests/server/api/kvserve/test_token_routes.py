"""llama-server's token-level routes against the fake engine: /tokenize (text or a chat),
/detokenize's flags, /apply-template, the special token ids in /v1/models and /props.
The fake's tokens are UTF-8 bytes, so a prompt's tokens are its text's bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from chat.template import CHATML
from server.app import create_app
from server.config.tree import LoadingSection, ModelSection, Settings
from tests.fakes import BOS, EOS, FakeEngine
from tests.server.api.test_openai_api import assert_error

MODEL = "fake-model"
HI = [{"role": "user", "content": "Hi"}]
CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
FLAGGED = "{% if flag %}F{% endif %}{% for m in messages %}B:{{ m.content }}{% endfor %}"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}]  # fmt: skip


@pytest.fixture
async def two() -> AsyncIterator[httpx.AsyncClient]:
    """Two models: `a` (the default, ChatML) and `b` (its own template)."""
    settings = Settings(
        models=(ModelSection(id="a"), ModelSection(id="b", chat_template=FLAGGED)),
        loading=LoadingSection(wait_s=0.2),
    )
    engines = {"a": FakeEngine(model_id="a"), "b": FakeEngine(model_id="b")}
    app = create_app(settings, engines=engines)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        yield client


async def _chat_prompt(client: httpx.AsyncClient, fake: FakeEngine, **body: Any) -> list[int]:
    """The prompt tokens /v1/chat/completions submits for `body`."""
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return list(fake.submitted[-1].prompt_tokens)


# -- /apply-template -------------------------------------------------------------------


async def test_apply_template_is_the_chat_prompt(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/apply-template", json={"messages": HI})
    assert r.status_code == 200 and r.json() == {"prompt": CHATML_HI}
    assert list(CHATML_HI.encode()) == await _chat_prompt(client, fake, messages=HI)
    # tools (described in a system prompt by this template) render as chat renders them
    body = {"messages": HI, "tools": TOOLS, "tool_choice": "required"}
    prompt = (await client.post("/apply-template", json=body)).json()["prompt"]
    assert "get_weather" in prompt and prompt != CHATML_HI
    assert list(prompt.encode()) == await _chat_prompt(client, fake, **body)


async def test_apply_template_without_generation_prompt(client: httpx.AsyncClient) -> None:
    body = {"messages": HI, "add_generation_prompt": False}
    r = await client.post("/apply-template", json=body)
    assert r.json() == {"prompt": "<|im_start|>user\nHi<|im_end|>\n"}


async def test_apply_template_names_a_model_and_its_kwargs(two: httpx.AsyncClient) -> None:
    r = await two.post("/apply-template", json={"messages": HI})
    assert r.json() == {"prompt": CHATML_HI}  # the default model's
    body = {"model": "b", "messages": HI, "chat_template_kwargs": {"flag": True}}
    assert (await two.post("/apply-template", json=body)).json() == {"prompt": "FB:Hi"}
    body["chat_template_kwargs"] = {}
    assert (await two.post("/apply-template", json=body)).json() == {"prompt": "B:Hi"}
    assert_error(
        await two.post("/apply-template", json={"model": "c", "messages": HI}), 404, "model"
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "bogus", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": HI, "add_generation_prompt": "maybe"}, "add_generation_prompt"),
        ({"messages": HI, "tools": [{"type": "function"}]}, "tools[0].function"),
        (
            {"messages": HI, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"messages": HI, "tools": [{"type": "mcp", "server_label": "s"}]}, "tools"),
        ({"messages": HI, "model": 5}, "model"),
    ],
)
async def test_apply_template_bad_input(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/apply-template", json=body), 400, param)


# -- /tokenize -------------------------------------------------------------------------


async def test_tokenize_a_chat_as_chat_completions_does(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    body = {"messages": HI, "tools": TOOLS}
    tokens = (await client.post("/tokenize", json=body)).json()["tokens"]
    assert tokens == await _chat_prompt(client, fake, **body)
    r = await client.post("/tokenize", json={"messages": HI, "add_generation_prompt": False})
    assert r.json()["tokens"] == list(b"<|im_start|>user\nHi<|im_end|>\n")


async def test_tokenize_a_chat_of_a_named_model(two: httpx.AsyncClient) -> None:
    body = {"model": "b", "messages": HI, "chat_template_kwargs": {"flag": True}}
    assert (await two.post("/tokenize", json=body)).json() == {"tokens": list(b"FB:Hi")}
    r = await two.post("/tokenize", json={"model": "b", "content": "x", "with_pieces": True})
    assert r.json() == {"tokens": [{"id": 120, "piece": "x"}]}
    assert_error(await two.post("/tokenize", json={"model": "c", "content": "x"}), 404, "model")


async def test_pieces_show_special_tokens_and_bytes(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    # "é" is two byte tokens here: neither is UTF-8 alone, so each shows as its byte
    r = await client.post("/tokenize", json={"content": "é", "with_pieces": True})
    assert r.json() == {"tokens": [{"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]}]}

    def with_specials(text: str, **_: Any) -> list[int]:
        return [BOS, *text.encode(), EOS]

    fake.tokenize = with_specials  # type: ignore[method-assign]
    r = await client.post("/tokenize", json={"content": "H", "with_pieces": True})
    assert r.json()["tokens"] == [
        {"id": BOS, "piece": "<s>"}, {"id": 72, "piece": "H"}, {"id": EOS, "piece": "<|im_end|>"}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "content"),
        ({"content": 5}, "content"),
        ({"content": "x", "messages": HI}, "messages"),
        ({"messages": HI, "add_special": True}, "add_special"),
        ({"messages": HI, "parse_special": False}, "parse_special"),
        ({"messages": [{"role": "bogus", "content": "x"}]}, "messages[0].role"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"content": "x", "with_pieces": "yes please"}, "with_pieces"),
    ],
)
async def test_tokenize_bad_input(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/tokenize", json=body), 400, param)


# -- /detokenize -----------------------------------------------------------------------


async def test_detokenize_flags(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    tokens = [BOS, 72, 105, EOS]
    r = await client.post("/detokenize", json={"tokens": tokens})
    assert r.json() == {"content": "<s>Hi<|im_end|>"}  # as llama-server: specials as text
    r = await client.post("/detokenize", json={"tokens": tokens, "unparse_special": False})
    assert r.json() == {"content": "Hi"}
    # remove_special drops the BOS the vocabulary adds (this one adds none) ...
    r = await client.post("/detokenize", json={"tokens": tokens, "remove_special": True})
    assert r.json() == {"content": "<s>Hi<|im_end|>"}
    fake._info = dataclasses.replace(fake._info, add_bos=True)  # ... and now it does
    r = await client.post("/detokenize", json={"tokens": tokens, "remove_special": True})
    assert r.json() == {"content": "Hi<|im_end|>"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tokens": [72], "remove_special": "x"}, "remove_special"),
        ({"tokens": [72], "unparse_special": [1]}, "unparse_special"),
        ({"tokens": [72], "model": 3}, "model"),
        ({"tokens": "Hi"}, "tokens"),
        ({"tokens": [99999]}, "tokens"),
    ],
)
async def test_detokenize_bad_input(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/detokenize", json=body), 400, param)


# -- the special token ids: /v1/models, /props ----------------------------------------


async def test_special_tokens_in_models_and_props(client: httpx.AsyncClient) -> None:
    meta = (await client.get("/v1/models")).json()["data"][0]["meta"]
    special = meta["special_tokens"]
    assert (special["bos"], special["eos"], special["eot"], special["nl"]) == (BOS, EOS, EOS, 10)
    assert special["fim_pre"] is None and special["pad"] is None
    assert set(special) == {"bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf",
                            "fim_mid", "fim_pad", "fim_rep", "fim_sep"}  # fmt: skip
    props = (await client.get("/props")).json()
    assert props["special_tokens"] == special
    assert props["chat_template"] == CHATML and props["eos_token"] == "<|im_end|>"
    assert props["total_slots"] == 4 and props["is_sleeping"] is False
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 512 and settings["params"]["temperature"] == 1.0
    assert "grammar" not in settings["params"]


async def test_props_of_a_named_or_unloaded_model(two: httpx.AsyncClient) -> None:
    props = (await two.get("/props", params={"model": "b"})).json()
    assert props["model_alias"] == "b" and props["chat_template"] == FLAGGED
    assert_error(await two.get("/props", params={"model": "c"}), 404, "model")
    await two.post("/v1/models/b/unload")
    props = (await two.get("/props", params={"model": "b"})).json()
    assert props["is_sleeping"] is True and "special_tokens" not in props


async def test_generation_fields_are_logged_as_playing_no_part(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"messages": HI, "temperature": 0.5, "max_tokens": 3, "tools": TOOLS}
    with caplog.at_level("INFO", logger="kvserve.server"):
        assert (await client.post("/apply-template", json=body)).status_code == 200
    (line,) = [r.getMessage() for r in caplog.records if "play no part" in r.getMessage()]
    assert "max_tokens" in line and "temperature" in line and "tools" not in line
