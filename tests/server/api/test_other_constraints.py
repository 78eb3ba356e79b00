"""The other servers' constraint fields (vLLM's guided_* and structured_outputs, SGLang's
regex and ebnf) become the grammar handed to the engine, on chat and completions; two
constraints, or one kvserve cannot read, are a 400 naming the field. And OpenAI's
reasoning_effort on chat (onto the template's thinking switches)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.helpers.gbnf_match import accepts
from tests.server.api.chat.test_tools import WEATHER
from tests.server.api.test_openai_api import MODEL, assert_error, chat

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
GBNF = 'root ::= "yes" | "no"\n'
# field -> value, an output its grammar accepts, one it refuses
FIELDS: list[tuple[dict[str, Any], str, str]] = [
    ({"guided_json": SCHEMA}, '{"n":5}', '{"n":"5"}'),
    ({"guided_json": json.dumps(SCHEMA)}, '{"n":5}', "5"),
    ({"guided_choice": ["red", "green"]}, "green", "blue"),
    ({"guided_regex": "[0-9]{3}-[a-z]+"}, "123-ab", "12-ab"),
    ({"guided_grammar": GBNF}, "no", "maybe"),
    ({"structured_outputs": {"json": SCHEMA}}, '{"n":1}', "[]"),
    ({"structured_outputs": {"json_object": True}}, '{"a":[1]}', "[1]"),
    ({"structured_outputs": {"regex": "a+b"}}, "aab", "ba"),
    ({"structured_outputs": {"choice": ["x", "y z"]}}, "y z", "y"),
    ({"structured_outputs": {"grammar": GBNF}}, "yes", "yess"),
    ({"regex": "(cat|dog)s?"}, "dogs", "cow"),
    ({"ebnf": GBNF}, "yes", ""),
]  # fmt: skip


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)  # room for a tool prompt


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 5, **extra}


@pytest.mark.parametrize(("field", "good", "bad"), FIELDS, ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_each_field_constrains_the_output(
    client: httpx.AsyncClient, fake: FakeEngine, route: str,
    field: dict[str, Any], good: str, bad: str,
) -> None:  # fmt: skip
    body = chat(**field) if route.endswith("chat/completions") else completion(**field)
    r = await client.post(route, json=body)
    assert r.status_code == 200, r.text
    grammar = fake.submitted[0].sampling.grammar
    assert grammar is not None
    assert accepts(grammar, good) and not accepts(grammar, bad)


async def test_guided_json_with_tools_is_the_document_beside_the_calls(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/chat/completions", json=chat(tools=[WEATHER], guided_json=SCHEMA))
    assert r.status_code == 200, r.text
    grammar = fake.submitted[0].sampling.grammar or ""
    assert "doc-document" in grammar.splitlines()[0] and '"\\"tool_calls\\""' in grammar


async def test_a_regex_with_tools_turned_off_constrains(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    body = chat(tools=[WEATHER], tool_choice="none", guided_regex="[a-c]+", stream=True)
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    grammar = fake.submitted[0].sampling.grammar or ""
    assert accepts(grammar, "abc") and not accepts(grammar, "abcd")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
        ({"grammar": GBNF, "regex": "a"}, "regex"),
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs.regex"),
        ({"guided_choice": ["a"], "ebnf": GBNF}, "ebnf"),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
        ({"tools": [WEATHER], "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_json": {"type": "objekt"}}, "guided_json"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"structured_outputs": {"json": {"$ref": "#/$defs/nope"}}}, "structured_outputs.json"),
        ({"guided_regex": "(?=x)x"}, "guided_regex"),
        ({"regex": "a("}, "regex"),
        ({"guided_grammar": "start: WORD\nWORD: /[a-z]+/"}, "guided_grammar"),
        ({"ebnf": "root ::= missing\n"}, "ebnf"),
        ({"guided_choice": []}, "guided_choice"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ],
)
async def test_two_constraints_or_an_unreadable_one_is_a_400_naming_it(
    client: httpx.AsyncClient, fake: FakeEngine, extra: dict[str, Any], param: str
) -> None:
    r = await client.post("/v1/chat/completions", json=chat(**extra))
    assert_error(r, 400, param)
    assert fake.submitted == []


async def test_completions_refuse_two_constraints_and_a_bad_schema(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/completions", json=completion(grammar=GBNF, guided_json=SCHEMA))
    assert_error(r, 400, "guided_json")
    r = await client.post("/v1/completions", json=completion(guided_json={"type": 5}))
    assert_error(r, 400, "guided_json")
    assert fake.submitted == []


async def test_hints_are_accepted_and_logged(
    client: httpx.AsyncClient, fake: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    body = chat(guided_choice=["a"], guided_whitespace_pattern=" ", guided_decoding_backend="xgrammar",
                structured_outputs={"disable_any_whitespace": True})  # fmt: skip
    caplog.set_level("INFO", logger="kvserve.server")
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert "guided_decoding_backend" in caplog.text and "disable_any_whitespace" in caplog.text


THINKING = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}{% endif %}"
)


@pytest.mark.parametrize(
    ("extra", "tail"),
    [
        ({}, "<|assistant|>"),
        ({"reasoning_effort": "none"}, "<|assistant|><think></think>"),
        ({"reasoning_effort": "high"}, "<|assistant|>[high]"),
        ({"reasoning_effort": "max"}, "<|assistant|>[high]"),
        # explicit chat_template_kwargs win over the effort
        ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "medium"}},
         "<|assistant|>[medium]"),
        ({"reasoning_effort": "minimal", "chat_template_kwargs": {"enable_thinking": True}},
         "<|assistant|>"),
    ],
)  # fmt: skip
async def test_reasoning_effort_sets_the_template_switches(
    make_client: ClientFactory, fake: FakeEngine, extra: dict[str, Any], tail: str
) -> None:
    client = make_client(fake)
    served = client._transport.app.state.models.default  # type: ignore[attr-defined]
    served.template_override, served._template = THINKING, None
    r = await client.post("/v1/chat/completions", json=chat(**extra))
    assert r.status_code == 200, r.text
    assert bytes(fake.submitted[0].prompt_tokens).decode() == "<|user|>Hi" + tail


async def test_unknown_reasoning_effort_is_a_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(reasoning_effort="extreme"))
    assert_error(r, 400, "reasoning_effort")
