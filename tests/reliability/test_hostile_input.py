"""Hostile requests against the real server: each gets its 4xx, nothing else breaks.

Numeric fields are found in the app's own request schemas, so a field added later is
attacked too without editing this file.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.api.chat.protocol import ChatCompletionRequest
from server.api.common import SamplingExtras
from server.api.completions.protocol import CompletionRequest
from server.api.embeddings.protocol import EmbeddingRequest
from tests.kvserve_process import MODEL, Server, running

pytestmark = pytest.mark.model

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
EMBEDDING = {"model": MODEL, "input": "Hi"}


@pytest.fixture
def http(healthy: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=healthy.url, timeout=60) as client:
        yield client


def post_raw(http: httpx.Client, path: str, content: bytes) -> httpx.Response:
    return http.post(path, content=content, headers={"Content-Type": "application/json"})


def assert_error(response: httpx.Response, status: int, param: str | None = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param != "":
        assert error["param"] == param, error
    return error


def test_ten_megabyte_body_is_refused(http: httpx.Client) -> None:
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 10_000_000}]})
    assert_error(post_raw(http, "/v1/chat/completions", big.encode()), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b" " * 1_000_000

    response = http.post(
        "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_error(response, 413)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_json(http: httpx.Client, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    for path, field in (
        ("/v1/chat/completions", "messages"),
        ("/v1/completions", "prompt"),
        ("/v1/embeddings", "input"),
    ):
        body = f'{{"model": "{MODEL}", "{field}": {nested}}}'.encode()
        assert_error(post_raw(http, path, body), 400)


def test_invalid_utf8_body(http: httpx.Client) -> None:
    head = b'{"model": "' + MODEL.encode() + b'", '
    for path, body in (
        (
            "/v1/chat/completions",
            head + b'"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}',
        ),
        # UTF-8 of a lone surrogate: Python's json decodes it ('surrogatepass')
        (
            "/v1/chat/completions",
            head + b'"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        ),
        ("/v1/completions", head + b'"prompt": "\xed\xa0\x80 surrogate"}'),
        ("/v1/completions", head + b'"prompt": "\\ud800 escaped surrogate"}'),
        ("/v1/embeddings", head + b'"input": "\xc3\x28"}'),
        ("/v1/embeddings", head + b'"input": ["ok", "\\udfff"]}'),
        ("/tokenize", b'{"content": "\\ud800"}'),
        ("/v1/embeddings", b'\xff\xfe{\x00"\x00'),
    ):
        assert_error(post_raw(http, path, body), 400)


def test_hundred_thousand_token_prompts_are_refused_quickly(http: httpx.Client) -> None:
    words = "hello " * 100_000  # about 100,000 tokens
    started = time.monotonic()
    chat = http.post(
        "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": words}]}
    )
    error = assert_error(chat, 400)
    assert error["code"] == "context_length_exceeded"
    ids = http.post("/v1/completions", json={**COMPLETION, "prompt": [42] * 100_000})
    assert assert_error(ids, 400)["code"] == "context_length_exceeded"
    text = http.post("/v1/completions", json={**COMPLETION, "prompt": words})
    assert assert_error(text, 400)["code"] == "context_length_exceeded"
    embed = http.post("/v1/embeddings", json={**EMBEDDING, "input": words})
    assert assert_error(embed, 400)["code"] == "context_length_exceeded"
    # Not a timing test, a hang detector: refusing must not mean computing the prompt.
    assert time.monotonic() - started < 60


def numeric_fields(model: type) -> list[tuple[str, str]]:
    """(field, "integer" | "number") for every numeric field of a request model."""
    schema = model.model_json_schema()  # type: ignore[attr-defined]
    out = []
    for name, prop in schema["properties"].items():
        options = prop.get("anyOf", [prop])
        kinds = {o.get("type") for o in options}
        if "integer" in kinds or "number" in kinds:
            out.append((name, "integer" if "integer" in kinds else "number"))
    return out


# JSON literals, spliced into the body as text: Python's json accepts NaN and Infinity.
HOSTILE = ["-1", "1e308", "-99999999999999999999999999999999", "99999999999999999999999999999999", "NaN", "Infinity", "-Infinity", "1.5"]  # fmt: skip
NON_FINITE = {"NaN", "Infinity", "-Infinity"}
NOT_INTEGERS = NON_FINITE | {"1.5", "1e308"}
SAMPLING = set(SamplingExtras.model_fields)
# The sampling fields are shared by chat and completions and go through the same code
# (server/serving/engine_requests.py), so they are
# attacked once, on the cheaper completions endpoint; chat gets its own fields.
CASES = [
    (path, base, field, kind)
    for path, base, model, skip in (
        ("/v1/chat/completions", CHAT, ChatCompletionRequest, SAMPLING),
        ("/v1/completions", COMPLETION, CompletionRequest, set()),
        ("/v1/embeddings", EMBEDDING, EmbeddingRequest, set()),
    )
    for field, kind in numeric_fields(model)
    if field not in skip
]


async def test_hostile_numbers_in_every_numeric_field(healthy: Server) -> None:
    assert len(CASES) >= 30  # the schema walk found the fields
    semaphore = asyncio.Semaphore(4)  # one per slot: never a 429 here

    async def attack(
        http: httpx.AsyncClient,
        path: str,
        base: dict[str, Any],
        field: str,
        kind: str,
        literal: str,
    ) -> str | None:
        body = {k: v for k, v in base.items() if k != field}
        text = json.dumps(body)[:-1] + f', "{field}": {literal}}}'
        async with semaphore:
            response = await http.post(
                path, content=text.encode(), headers={"Content-Type": "application/json"}
            )
        where = f"{path} {field}={literal}: {response.status_code} {response.text[:200]}"
        must_refuse = literal in NON_FINITE or (kind == "integer" and literal in NOT_INTEGERS)
        if response.status_code == 200:
            ok = not must_refuse and response.json()["object"] in (
                "chat.completion",
                "text_completion",
                "list",
            )
        else:
            error = response.json().get("error", {})
            ok = 400 <= response.status_code < 500 and bool(error.get("message"))
            ok = ok and (
                not must_refuse or (response.status_code == 400 and error["param"] == field)
            )
        return None if ok else where

    async with httpx.AsyncClient(base_url=healthy.url, timeout=120) as http:
        results = await asyncio.gather(
            *(attack(http, *case, literal) for case in CASES for literal in HOSTILE)
        )
    assert [r for r in results if r] == []


# A configured template override that tries, by the last user message, one way after
# another to reach Python internals; any other message renders as ChatML.
ESCAPES = {
    "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}",
    "base": "{{ messages[0].__class__.__base__.__subclasses__() }}",
    "context": "{{ self._TemplateReference__context }}",
    "raise": "{{ raise_exception.__globals__['__builtins__'] }}",
    "format": "{{ '{0.__class__.__init__.__globals__}'.format(messages) }}",
    "loop": "{% for i in range(10**9) %}{% endfor %}",
}
HOSTILE_TEMPLATE = (
    "{% set last = messages[-1]['content'] %}"
    + "".join(
        f"{'{% if' if i == 0 else '{% elif'} last == '{name}' %}}{attack}"
        for i, (name, attack) in enumerate(ESCAPES.items())
    )
    + "{% else %}{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chat_template_override_cannot_escape_the_sandbox(tmp_path: Path, healthy: Server) -> None:
    template = tmp_path / "hostile.jinja"
    template.write_text(HOSTILE_TEMPLATE)
    args = ["--chat-template", str(template), "--parallel", "1", "--n-ctx", "256"]
    with running(args, tmp_path) as hostile, httpx.Client(base_url=hostile.url, timeout=60) as http:
        for name in ESCAPES:
            body = {**CHAT, "messages": [{"role": "user", "content": name}]}
            response = http.post("/v1/chat/completions", json=body)
            assert_error(response, 400, "messages")
        assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()
        normal = http.post("/v1/chat/completions", json=CHAT)
        assert normal.status_code == 200, normal.text
        assert http.post("/v1/completions", json=COMPLETION).status_code == 200
