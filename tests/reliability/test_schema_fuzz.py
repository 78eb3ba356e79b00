"""Schemathesis against the app's own OpenAPI schema: generated requests, valid and
invalid, to every operation. Zero 5xx; the server serves normally afterwards.

Two targets, because thousands of requests against the real model would not fit the
suite's time budget on 2 cores:
- most of them (a few thousand) go to the app in-process (ASGI) over the fake engine:
  that exercises every route, the validation, the error handlers and the request ->
  engine translation, at no model cost;
- a few hundred go over HTTP to the real server of this package (4 slots, 256-token
  context, so a generation is short whatever max_tokens says), where sampler chains,
  grammars, tokenization and the engine thread meet the generated values.
Generation is deterministic (same cases every run) so that CI is reproducible.
"""

from __future__ import annotations

import collections

import pytest
import schemathesis
from schemathesis import Case

from server.app import create_app
from server.config.tree import Settings
from tests.fakes import FakeEngine
from tests.kvserve_process import MODEL, Server
from tests.reliability.conftest import assert_serves

FAKE = FakeEngine(n_ctx=512, n_seq_max=4, max_queue=64)
APP = create_app(Settings(), engine=FAKE)
IN_PROCESS = schemathesis.openapi.from_asgi("/openapi.json", APP)
IN_PROCESS.config.generation.update(
    modes=["positive", "negative"], max_examples=150, deterministic=True, database="none"
)
STATUSES: collections.Counter[tuple[str, int]] = collections.Counter()
REAL_STATUSES: collections.Counter[tuple[str, int]] = collections.Counter()


def aim_at_the_model(case: Case, model: str) -> None:
    """Generated `model` strings would all be 404s: name the served model instead
    (unknown models are tested elsewhere), so the rest of the body is exercised.

    A valid body (positive mode) also gets the cross-field rules that OpenAPI cannot
    state here fixed up, or most chat requests would stop at them: `top_logprobs`
    needs `logprobs`; a message needs content unless it is the assistant's; tool
    messages need a tool call to answer."""
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = model
    meta = getattr(case, "meta", None)
    if meta is None or meta.generation.mode.is_negative:
        return
    if body.get("top_logprobs") is not None:
        body["logprobs"] = True
    label = case.operation.label
    if label == "POST /v1/responses":  # a made-up id is a 404; JSON items are free-form
        body.pop("previous_response_id", None)
        if not isinstance(body.get("input"), str):
            body["input"] = "hi"
        body.pop("tools", None)
    if label.startswith("POST /v1/messages"):  # blocks and tools are free-form JSON
        body["messages"] = [{"role": "user", "content": "hi"}]
        body.pop("tools", None)
        body.pop("system", None)
        if body.get("thinking") and body["thinking"].get("type") == "enabled":
            body["thinking"] = None
        return
    messages = body.get("messages")
    if not isinstance(messages, list):  # another route's body: `messages` is an extra key
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            message["role"] = "user"
        if message.get("content") is None and message.get("role") != "assistant":
            message["content"] = "hi"


@IN_PROCESS.parametrize()
def test_in_process_never_5xx(case: Case) -> None:
    aim_at_the_model(case, FAKE.info.model_id)
    response = case.call()
    STATUSES[(case.operation.label, response.status_code)] += 1
    assert response.status_code < 500, (case.body, response.text)


def check_total(statuses: collections.Counter[tuple[str, int]], where: str, at_least: int) -> None:
    """Skipped when the generated tests did not run; else the tally, printed, is large."""
    total = sum(statuses.values())
    if not total:
        pytest.skip("run with the generated tests above")
    print(f"schemathesis {where}: {total} requests, {statuses.most_common()}")
    assert total >= at_least, statuses


def test_in_process_totals_and_the_app_still_serves() -> None:
    check_total(STATUSES, "in-process", 2000)
    # generation reached the engine, not only the validators
    assert STATUSES[("POST /v1/chat/completions", 200)] >= 20, STATUSES
    assert STATUSES[("POST /v1/completions", 200)] >= 20, STATUSES
    assert STATUSES[("POST /v1/responses", 200)] >= 5, STATUSES
    assert STATUSES[("POST /v1/messages", 200)] >= 5, STATUSES
    assert not FAKE.running and FAKE.outstanding == 0
    from starlette.testclient import TestClient

    with TestClient(APP) as client:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 200


# The real server's /openapi.json is this same app's schema (it does not depend on the
# engine); loaded from a dict, the cases go over HTTP to whatever base_url they are given.
REAL = schemathesis.openapi.from_dict(APP.openapi())
REAL.config.generation.update(
    modes=["positive", "negative"], max_examples=15, deterministic=True, database="none"
)


@pytest.mark.model
@REAL.parametrize()
def test_real_engine_never_5xx(case: Case, server: Server) -> None:
    aim_at_the_model(case, MODEL)
    if isinstance(case.body, dict):
        # Short outputs keep a few hundred generations affordable; the engine path is
        # the same for 8 tokens as for 200 (max_tokens itself is attacked elsewhere).
        case.body["max_tokens"] = 8
        if case.operation.label == "POST /v1/responses":
            del case.body["max_tokens"]
            case.body["max_output_tokens"] = 8
    response = case.call(base_url=server.url, timeout=120)
    REAL_STATUSES[(case.operation.label, response.status_code)] += 1
    assert response.status_code < 500, (case.body, response.text)
    assert server.process.poll() is None, server.log()[-4000:]


@pytest.mark.model
def test_real_engine_totals_and_the_server_still_serves(server: Server) -> None:
    check_total(REAL_STATUSES, "real engine", 200)
    assert REAL_STATUSES[("POST /v1/chat/completions", 200)] >= 5, REAL_STATUSES
    assert_serves(server)  # /health ok (engine thread alive), a normal chat answered
