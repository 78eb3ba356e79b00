"""The agent clients' captured sessions (bench/agent_sessions/*.json) that
bench/agent_replay.py sends again: loading, checking, filling in.

A session file is one client's tool loop as the client sent it: `turns` in order (turn 2
resends turn 1 plus the assistant's call, as the capturing stand-in answered it, and the
tool's result), each a `path`, the API-relevant `headers` and the raw `body`; `side`
requests the client sent beside turn 1 (opencode's title request); `skip`, the servers a
session is not sent to and why. Two placeholders stand where a replay puts its own values:
MODEL as the body's `model` (the name the server serves), SESSION where the client's own
session id was (headers, `metadata`, `prompt_cache_key`, `client_metadata`), so that
sessions replayed at once do not share one. Nothing else differs from the capture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SESSIONS_DIR = Path(__file__).resolve().parent / "agent_sessions"
MODEL = "{{model}}"
SESSION = "{{session}}"

# The wire API of each session: the key of its conversation and of its reply's length.
ITEMS = {"messages": "messages", "chat": "messages", "responses": "input"}
MAX_TOKENS = {"messages": "max_tokens", "chat": "max_tokens", "responses": "max_output_tokens"}

# Headers a server may act on (API version and betas, the client's session and request
# ids, what it accepts); the rest (transport, SDK telemetry, credentials) are dropped.
KEPT_HEADERS = frozenset({
    "content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta",
    "x-claude-code-session-id", "session-id", "thread-id", "x-client-request-id",
    "x-codex-window-id", "x-codex-beta-features", "originator",
    "x-openai-internal-codex-responses-lite", "x-session-id", "x-session-affinity",
})  # fmt: skip

# How bench/agent_sessions/ was made from the capture (--import-capture DIR): per session,
# the client, its API, the captured turns in order, requests sent beside turn 1, and the
# client's session id in them (replaced by the SESSION placeholder).
CAPTURED = {
    "claude-code": ("Claude Code 2.1.332, claude -p, its default model, a Bash tool round",
                    "messages", ["claude-tool-1", "claude-tool-2"], [],
                    "a64f008a-68dc-4be2-9169-a289f05f8b1f"),
    "codex": ("Codex 0.171.0, codex exec, a model name Codex does not know, an "
              "exec_command tool round", "responses", ["codex-tool-1", "codex-tool-2"], [],
              "01a24499-e0ba-7343-aba7-71eebeaf0e50"),
    "codex-default-model": ("Codex 0.171.0, codex exec, its default model (tools in an "
                            "additional_tools input item, a custom exec tool round)",
                            "responses",
                            ["codex-default-model-tool-1", "codex-default-model-tool-2"], [],
                            "01a244a3-8599-7781-90e4-a6e9cc8c0020"),
    "opencode": ("opencode 1.18.33, opencode run, openai-compatible provider, a bash tool "
                 "round; its title request beside turn 1", "chat",
                 ["opencode-tool-2", "opencode-tool-3"], ["opencode-tool-1"],
                 "dbb6614bfffeETyJCa0ihfsHrn"),
    "qwen-code": ("Qwen Code 0.24.4, qwen -p --yolo, a run_shell_command tool round", "chat",
                  ["qwen-tool-1", "qwen-tool-2"], [], None),
}  # fmt: skip
SKIP = {
    "codex-default-model": {
        "llama-server": "llama-server's /v1/responses knows no 'additional_tools' or "
        "'custom_tool_call' input item (tools/server/server-chat.cpp, "
        "server_chat_convert_responses_to_chatcmpl): 400 'Cannot determine type of item'"
    }
}


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class Session:
    name: str
    client: str
    api: str
    turns: list[Request]
    side: list[Request] = field(default_factory=list)
    skip: dict[str, str] = field(default_factory=dict)

    @property
    def items(self) -> str:
        return ITEMS[self.api]

    def vary_at(self) -> tuple[int, int | None]:
        """Where a replayed copy's number goes: the last user item of turn 1 (the task;
        every later turn resends it at the same place) and its last text part (None: its
        content is a string)."""
        items = self.turns[0].body[self.items]
        index = max(i for i, item in enumerate(items) if item.get("role") == "user")
        content = items[index]["content"]
        if isinstance(content, str):
            return index, None
        return index, max(i for i, part in enumerate(content) if "text" in part)


def _request(raw: dict[str, Any]) -> Request:
    return Request(raw["path"], dict(raw.get("headers", {})), raw["body"])


def load(path: Path) -> Session:
    raw = json.loads(path.read_text())
    if raw["api"] not in ITEMS:
        raise ValueError(f"{path.name}: api {raw['api']!r} is not one of {sorted(ITEMS)}")
    return Session(raw["name"], raw["client"], raw["api"],
                   [_request(t) for t in raw["turns"]], [_request(s) for s in raw.get("side", [])],
                   dict(raw.get("skip", {})))  # fmt: skip


def load_all(folder: Path = SESSIONS_DIR) -> list[Session]:
    return [load(p) for p in sorted(folder.glob("*.json"))]


def canonical(value: Any) -> Any:
    """A body part as the model sees it: `cache_control` markers dropped (Claude Code moves
    its marker to the newest message each turn) and a content list of one plain text
    block read as that text (it sends an earlier message's single block as a string)."""
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: canonical(v) for k, v in value.items() if k != "cache_control"}
    content = out.get("content")
    if (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)
            and set(content[0]) == {"type", "text"} and content[0]["type"] == "text"):  # fmt: skip
        out["content"] = content[0]["text"]
    return out


def problems(session: Session) -> list[str]:
    """What makes a session file unfit to replay; empty when it is fine. Each turn names
    the model by the placeholder and resends the turn before it: its conversation starts
    with the previous turn's (read canonically), and every other field is unchanged."""
    found = []
    for number, turn in enumerate(session.turns + session.side, 1):
        if turn.body.get("model") != MODEL:
            found.append(f"{session.name} request {number}: model is not {MODEL}")
        if not turn.path.startswith("/v1/"):
            found.append(f"{session.name} request {number}: path {turn.path!r}")
    key = session.items
    for k, (before, after) in enumerate(zip(session.turns, session.turns[1:], strict=False), 1):
        old, new = before.body[key], after.body[key]
        if len(new) <= len(old) or canonical(new[: len(old)]) != canonical(old):
            found.append(f"{session.name} turn {k + 1}: {key} do not extend turn {k}'s")
        rest = {n for n in before.body.keys() | after.body.keys()
                if n != key and before.body.get(n) != after.body.get(n)}  # fmt: skip
        if rest:
            found.append(f"{session.name} turn {k + 1}: {sorted(rest)} differ from turn {k}")
    return found


def _filled(value: Any, model: str, session_id: str) -> Any:
    if isinstance(value, str):
        return value.replace(MODEL, model).replace(SESSION, session_id)
    if isinstance(value, list):
        return [_filled(v, model, session_id) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, model, session_id) for k, v in value.items()}
    return value


def fill(
    session: Session, request: Request, model: str, session_id: str, number: int | None,
    max_tokens: int,
) -> Request:  # fmt: skip
    """The request as sent: placeholders filled, a short greedy reply asked for (the
    replay measures prompt processing, not the clients' 32k-128k-token replies), and, for
    copy `number` of several at once, the task of a turn (None for a side request) marked
    with its number so the copies share the system prompt and tools but not the
    conversation."""
    body = _filled(request.body, model, session_id)
    body[MAX_TOKENS[session.api]] = max_tokens
    body["temperature"] = 0
    if number is not None:
        index, part = session.vary_at()
        item = body[session.items][index]
        mark = f" (session {number})"
        if part is None:
            item["content"] += mark
        else:
            item["content"][part]["text"] += mark
    return Request(request.path, _filled(request.headers, model, session_id), body)


def _placeheld(value: Any, session_id: str | None) -> Any:
    if isinstance(value, str):
        return value.replace(session_id, SESSION) if session_id else value
    if isinstance(value, list):
        return [_placeheld(v, session_id) for v in value]
    if isinstance(value, dict):
        return {k: _placeheld(v, session_id) for k, v in value.items()}
    return value


def from_capture(raw: dict[str, Any], session_id: str | None) -> dict[str, Any]:
    """A captured request (the stand-in server's record: method, path, headers, body) as a
    session file's request: the kept headers, the model and the session id replaced by
    their placeholders (the model only as the body's own `model` field)."""
    headers = {k: v for k, v in raw["headers"].items() if k.lower() in KEPT_HEADERS}
    body = {**_placeheld(raw["body"], session_id), "model": MODEL}
    return {"path": raw["path"], "headers": _placeheld(headers, session_id), "body": body}


def import_capture(folder: Path) -> None:
    """--import-capture DIR: bench/agent_sessions/ written anew from a capture's files."""
    for name, (client, api, turns, side, session_id) in CAPTURED.items():

        def read(stem: str, sid: str | None = session_id) -> dict:
            return from_capture(json.loads((folder / f"{stem}.json").read_text()), sid)

        out = {"name": name, "client": client, "api": api, "captured": turns + side,
               "skip": SKIP.get(name, {}), "side": [read(s) for s in side],
               "turns": [read(t) for t in turns]}  # fmt: skip
        (SESSIONS_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
