"""bench/agent_replay.py's sessions and figures, without a model or a server: the captured
sessions load and resend their earlier turns, the placeholders are filled, each API's
stream is read right (kvserve's counts and llama-server's), and the report adds up."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from bench import agent_replay
from bench.agent_replay import Turn, probe_summary, ratios, replay, summarize
from bench.replay_sessions import (
    CAPTURED,
    MAX_TOKENS,
    MODEL,
    SESSION,
    Session,
    canonical,
    fill,
    from_capture,
    load,
    load_all,
    problems,
)
from bench.replay_wire import Counts, Reply, generated

SESSIONS = {s.name: s for s in load_all()}
PATHS = {"messages": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}


def test_every_client_has_a_session_of_two_turns_or_more() -> None:
    assert set(SESSIONS) == set(CAPTURED)
    assert {s.api for s in SESSIONS.values()} == {"messages", "responses", "chat"}
    for s in SESSIONS.values():
        assert len(s.turns) >= 2, s.name
        assert all(t.path.startswith(PATHS[s.api]) for t in s.turns + s.side), s.name
    assert len(SESSIONS["opencode"].side) == 1  # its title request, sent beside turn 1
    assert "llama-server" in SESSIONS["codex-default-model"].skip


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_each_turn_resends_the_turn_before_it(name: str) -> None:
    session = SESSIONS[name]
    assert problems(session) == []
    key = session.items
    for before, after in zip(session.turns, session.turns[1:], strict=False):
        old, new = before.body[key], after.body[key]
        assert len(new) >= len(old) + 2  # the assistant's call and the tool's result
        assert canonical(new[: len(old)]) == canonical(old)


def test_claude_codes_turns_match_only_once_its_cache_markers_are_read_away() -> None:
    first, second = (t.body["messages"] for t in SESSIONS["claude-code"].turns)
    assert second[: len(first)] != first  # as captured: the markers moved, a block became text
    assert canonical(second[: len(first)]) == canonical(first)


def test_a_session_whose_turn_drops_an_item_is_a_problem(tmp_path: Path) -> None:
    session = SESSIONS["qwen-code"]
    broken = dataclasses.replace(
        session.turns[1],
        body={**session.turns[1].body, "messages": session.turns[1].body["messages"][1:]},
    )
    found = problems(dataclasses.replace(session, turns=[session.turns[0], broken]))
    assert found == ["qwen-code turn 2: messages do not extend turn 1's"]
    renamed = dataclasses.replace(session.turns[0], body={**session.turns[0].body, "model": "x"})
    assert "model is not" in problems(dataclasses.replace(session, turns=[renamed]))[0]


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_the_placeholders_are_filled(name: str) -> None:
    session = SESSIONS[name]
    raw = json.dumps([dataclasses.asdict(t) for t in session.turns + session.side])
    assert raw.count(MODEL) == len(session.turns + session.side)  # the model field only
    for request in session.turns:
        sent = fill(session, request, "served", "abc-123", None, 16)
        text = json.dumps(dataclasses.asdict(sent))
        assert MODEL not in text and SESSION not in text
        assert sent.body["model"] == "served"
        assert sent.body[MAX_TOKENS[session.api]] == 16 and sent.body["temperature"] == 0
        # unnumbered, nothing else changes
        assert {
            k: v
            for k, v in sent.body.items()
            if k not in ("model", "temperature", MAX_TOKENS[session.api])
        } == {
            k: v
            for k, v in json.loads(json.dumps(request.body).replace(SESSION, "abc-123")).items()
            if k not in ("model", "temperature", MAX_TOKENS[session.api])
        }
    if SESSION in raw:  # every client but Qwen Code names its session
        sent = fill(session, session.turns[0], "served", "abc-123", None, 16)
        assert "abc-123" in json.dumps(dataclasses.asdict(sent))


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_a_numbered_copy_marks_its_task_in_every_turn_and_nothing_else(name: str) -> None:
    session = SESSIONS[name]
    index, _ = session.vary_at()
    key = session.items
    for request in session.turns:
        plain = fill(session, request, "m", "s", None, 16).body
        marked = fill(session, request, "m", "s", 3, 16).body
        assert json.dumps(marked[key][index]).count("(session 3)") == 1
        assert marked[key][index]["role"] == "user"
        assert [i for i, (a, b) in enumerate(zip(plain[key], marked[key], strict=True))
                if a != b] == [index]  # fmt: skip
        # the system prompt and tools stay shared between copies
        assert {k: v for k, v in marked.items() if k != key} == {
            k: v for k, v in plain.items() if k != key
        }


def test_a_capture_becomes_a_session_request() -> None:
    raw = {"n": 1, "method": "POST", "path": "/v1/chat/completions",
           "headers": {"Host": "h", "Authorization": "Bearer k", "x-session-id": "ses_42",
                       "User-Agent": "agent/1"},
           "body": {"model": "m-1", "messages": [{"role": "user", "content": "m-1 ses_42"}],
                    "metadata": {"model": "m-1"}}}  # fmt: skip
    request = from_capture(raw, "42")
    assert request["headers"] == {"x-session-id": f"ses_{SESSION}", "User-Agent": "agent/1"}
    assert request["body"]["model"] == MODEL
    # the model's name stays where it is text; the session id goes everywhere
    assert request["body"]["messages"][0]["content"] == f"m-1 ses_{SESSION}"
    assert request["body"]["metadata"] == {"model": "m-1"}


# --- the streams: what kvserve and llama-server send, in brief


def read(api: str, events: list[dict]) -> Reply:
    counts, reply = Counts(api), Reply()
    for e in events:
        counts.read(e)
    counts.into(reply)
    return reply


def test_chat_counts_from_usage_or_llama_servers_timings() -> None:
    usage = {"prompt_tokens": 900, "completion_tokens": 16,
             "prompt_tokens_details": {"cached_tokens": 850}}  # fmt: skip
    kv = read(
        "chat", [{"choices": [{"delta": {"content": "hi"}}]}, {"choices": [], "usage": usage}]
    )
    assert (kv.prompt, kv.computed, kv.completion) == (900, 50, 16)
    peer = read(
        "chat", [{"choices": [], "usage": usage, "timings": {"prompt_n": 52, "cache_n": 848}}]
    )
    assert peer.computed == 52  # what llama-server says it decoded wins


def test_messages_merges_llama_servers_start_with_the_delta() -> None:
    llama = [{"type": "message_start", "message": {"usage": {
                 "input_tokens": 30, "cache_read_input_tokens": 970, "output_tokens": 0}}},
             {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}},
             {"type": "message_delta", "usage": {"output_tokens": 16}}]  # fmt: skip
    reply = read("messages", llama)
    assert (reply.prompt, reply.computed, reply.completion) == (1000, 30, 16)
    kvserve = [{"type": "message_start", "message": {"usage": {
                   "input_tokens": 1000, "cache_read_input_tokens": 0, "output_tokens": 0}}},
               {"type": "message_delta", "usage": {
                   "input_tokens": 40, "cache_read_input_tokens": 960,
                   "cache_creation_input_tokens": 0, "output_tokens": 16}}]  # fmt: skip
    reply = read("messages", kvserve)
    assert (reply.prompt, reply.computed) == (1000, 40)  # the final split, not the first


def test_responses_counts_from_completed_and_errors_are_kept() -> None:
    done = {
        "type": "response.completed",
        "response": {
            "usage": {
                "input_tokens": 500,
                "output_tokens": 16,
                "input_tokens_details": {"cached_tokens": 480},
            }
        },
    }
    reply = read("responses", [{"type": "response.created", "response": {"usage": None}}, done])
    assert (reply.prompt, reply.computed, reply.completion, reply.error) == (500, 20, 16, "")
    failed = read("responses", [{"type": "error", "error": {"message": "context exceeded"}}])
    assert "context exceeded" in failed.error


@pytest.mark.parametrize(("api", "event", "counts"), [
    ("chat", {"choices": [{"delta": {"role": "assistant"}}]}, False),
    ("chat", {"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
    ("messages", {"type": "message_start", "message": {}}, False),
    ("messages", {"type": "content_block_start", "content_block": {"type": "text"}}, False),
    ("messages", {"type": "content_block_start", "content_block": {"type": "tool_use"}}, True),
    ("messages", {"type": "content_block_delta", "delta": {}}, True),
    ("responses", {"type": "response.in_progress"}, False),
    ("responses", {"type": "response.output_item.added", "item": {"type": "message"}}, False),
    ("responses", {"type": "response.output_item.added", "item": {"type": "function_call"}}, True),
    ("responses", {"type": "response.output_text.delta", "delta": "x"}, True),
])  # fmt: skip
def test_the_first_token_is_the_first_generated_output(api: str, event: dict, counts: bool) -> None:
    assert generated(api, event) is counts


# --- the report


def turn(
    copy: int | None, k: int, ttft: float, prompt: int, computed: int, error: str = ""
) -> Turn:
    return Turn("c", copy, k, Reply(ttft, ttft + 0.5, prompt, computed, 16, error))


def test_the_summary_separates_turn_1_from_later_turns() -> None:
    turns = [turn(1, 1, 4.0, 1000, 1000), turn(1, 2, 0.2, 1100, 60),
             turn(2, 1, 6.0, 1000, 40), turn(2, 2, 0.4, 1100, 1100),
             turn(3, 1, 5.0, 1000, 40), turn(3, 0, 1.0, 300, 300)]  # fmt: skip
    row = summarize(turns, 12.346)
    assert row["wall_s"] == 12.35
    assert row["ttft_p50_turn1_s"] == 5.0 and row["ttft_p50_later_s"] == 0.3
    assert row["computed_per_turn"] == [360, 580] and row["prompt_per_turn"] == [1000, 1100]
    assert row["computed_tokens"] == 2240 + 300  # the side request counts in the totals
    assert row["errors"] == 0 and row["first_error"] == ""


def test_failed_turns_are_counted_not_averaged() -> None:
    row = summarize([turn(None, 1, 3.0, 900, 900), turn(None, 2, 9.0, 0, 0, "HTTP 400: x")], 3.0)
    assert row["errors"] == 1 and row["first_error"] == "HTTP 400: x"
    assert row["computed_per_turn"] == [900] and row["ttft_p50_later_s"] is None


def test_the_grammar_cost_is_the_median_difference() -> None:
    tools = [Reply(total=t, prompt=1000, computed=c) for t, c in ((0.9, 40), (0.30, 1), (0.32, 1))]
    none = [Reply(total=t, prompt=600, computed=1) for t in (0.10, 0.12, 0.50)]
    probe = probe_summary(tools, none)
    assert probe["grammar_ms"] == 200.0  # medians: 0.32 - 0.12, an outlier either side
    assert (probe["prompt_tools"], probe["prompt_none"]) == (1000, 600)
    assert (probe["computed_tools"], probe["computed_none"]) == (1, 1)
    assert "error" in probe_summary([Reply(error="HTTP 500")], none)


def test_ratios_are_kvserve_over_llama_server_per_client_and_mode() -> None:
    rows: list[dict] = [
            {"server": "kvserve", "mode": "several", "client": "c", "wall_s": 10.0},
            {"server": "llama-server", "mode": "several", "client": "c", "wall_s": 40.0},
            {"server": "kvserve", "mode": "alone", "client": "c", "wall_s": 5.0},
            {"server": "llama-server", "mode": "alone", "client": "d", "skipped": "why"}]  # fmt: skip
    assert ratios(rows) == ["c, several: kvserve / llama-server wall 0.25x"]


# --- a replay over a stand-in transport (no server)


def sse(*events: dict) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def test_a_replay_sends_each_turn_then_stops_at_a_refusal() -> None:
    session: Session = SESSIONS["opencode"]
    seen: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"body": body, "session": request.headers.get("x-session-id")})
        if len(body["messages"]) > 3:  # turn 2
            return httpx.Response(400, json={"error": {"message": "no"}})
        usage = {"prompt_tokens": 100, "completion_tokens": 2}
        return httpx.Response(
            200,
            content=sse(
                {"choices": [{"delta": {"content": "a"}}]}, {"choices": [], "usage": usage}
            ),
        )

    def connect() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://t")

    turns = asyncio.run(replay(connect, session, "served", 2, 16))
    assert [(t.turn, t.reply.error[:8]) for t in turns] == [(1, ""), (0, ""), (2, "HTTP 400")]
    assert turns[0].reply.prompt == 100 and turns[0].reply.computed == 100
    assert len(seen) == 3 and len({s["session"] for s in seen}) == 1
    assert seen[0]["session"].startswith("ses_") and SESSION not in seen[0]["session"]
    titles = [s for s in seen if "Generate a title" in json.dumps(s["body"])]
    assert len(titles) == 1 and "(session 2)" not in json.dumps(titles[0]["body"])


def test_validate_passes_on_the_sessions_as_committed(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_replay.validate(list(SESSIONS.values())) == 0
    assert "5 sessions, 0 problems" in capsys.readouterr().out


def test_a_session_file_names_a_known_api(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"name": "x", "client": "x", "api": "completions", "turns": []}))
    with pytest.raises(ValueError, match="api 'completions'"):
        load(path)


# --- kvserve takes every session: its app over the fake engine (no model, no process)


@pytest.mark.parametrize("name", sorted(SESSIONS))
async def test_kvserve_takes_every_turn_and_the_replay_reads_its_counts(name: str) -> None:
    from server.app import create_app
    from server.config.tree import Settings
    from tests.fakes import FakeEngine

    fake = FakeEngine(n_ctx=200_000)  # a token a byte: Qwen Code's turn 2 is ~76k bytes
    fake.cached = 100
    app = create_app(Settings(), engine=fake)

    def connect() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    session = SESSIONS[name]
    args = argparse.Namespace(sessions=2, reply_tokens=16, probe_rounds=1)
    row = await agent_replay.measure(connect, session, "kvserve", "several", "fake-model", args)
    assert (row["errors"], row["first_error"]) == (0, "")
    first, second = row["prompt_per_turn"]
    assert 10_000 < first < second  # the whole captured prompt, then more
    assert row["computed_per_turn"] == [first - 100, second - 100]  # what the fake reused
    assert len(fake.submitted) == 2 * (len(session.turns) + len(session.side))
    alone = await agent_replay.measure(connect, session, "kvserve", "alone", "fake-model", args)
    mark = len(" (session 1)")  # a token a byte: the copies' mark is all that differs
    assert alone["errors"] == 0 and alone["prompt_per_turn"] == [first - mark, second - mark]
    assert alone["grammar"]["prompt_tools"] == first - mark  # turn 1 as the alone mode sent it
    assert alone["grammar"]["prompt_none"] > 0


async def test_a_session_a_server_cannot_take_is_skipped_unsent() -> None:
    def connect() -> httpx.AsyncClient:
        raise AssertionError("nothing is sent")

    args = argparse.Namespace(sessions=2, reply_tokens=16, probe_rounds=1)
    row = await agent_replay.measure(connect, SESSIONS["codex-default-model"], "llama-server",
                                     "alone", "m", args)  # fmt: skip
    assert "additional_tools" in row["skipped"]
