"""The agent programs people run (Claude Code, Codex, opencode, Qwen Code), unchanged,
against kvserve: each pointed at it the way docs/clients.md says, its traffic recorded
by a logging proxy in between.

On the fake engine (tests/helpers/agent_engine.py) the whole tool loop runs whatever a
model would do: the client asks for its shell tool on a file only the tool can read,
runs it, sends the result back, and prints the final answer. On the real default model
one turn of each client completes. In both, kvserve refuses nothing the client sends
(no 4xx or 5xx in the recorded traffic): a newer client that breaks kvserve fails here.
And Codex, its stream idle timeout shortened below a scripted prefill delay, completes
its tool loop on kvserve's heartbeat events alone (and fails without them).

The clients are the versions pinned in tests/e2e/agents/ (installed by .ci/run, or on
first use here).
"""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.serving import sse
from tests.helpers.agent_clients import (
    CLAUDE,
    CLIENTS,
    CODEX,
    CODEX_OWN_MODEL,
    OPENCODE,
    Client,
    Setup,
    run,
)
from tests.helpers.agent_engine import ToolLoopEngine
from tests.helpers.logging_proxy import LoggingProxy, logging_proxy
from tests.helpers.threaded_server import serving
from tests.kvserve_process import running

FAKE_MODEL = "fake-model"  # FakeEngine's model id


def explain(proxy: LoggingProxy, done: subprocess.CompletedProcess[str]) -> str:
    """What a failing assertion shows: the refused exchanges, then the client's output."""
    refused = "\n".join(e.summary() for e in proxy.refused())
    seen = "\n".join(f"{e.method} {e.path} -> {e.status}" for e in proxy.exchanges)
    return (
        f"refused:\n{refused}\nall:\n{seen}\nclient (rc {done.returncode}):\n{done.stdout[-4000:]}"
    )


def write_note(root: Path) -> str:
    """A secret in root/work/note.txt: only the client's tool can bring it to a prompt."""
    secret = f"note-{uuid.uuid4().hex[:16]}"
    (root / "work").mkdir(parents=True)
    (root / "work" / "note.txt").write_text(secret + "\n")
    return secret


# Each client with the served model's name, then Claude Code and Codex with nothing
# configured but the URL: their own default model names (claude-opus-*, gpt-*), which
# Codex follows with other tools (CODEX_OWN_MODEL).
TOOL_LOOPS = [(c, FAKE_MODEL) for c in CLIENTS] + [(CLAUDE, None), (CODEX_OWN_MODEL, None)]


@pytest.mark.parametrize(("client", "model"), TOOL_LOOPS,
                         ids=[c.name + ("" if m else "-own-name") for c, m in TOOL_LOOPS])  # fmt: skip
def test_tool_loop_on_the_fake_engine(client: Client, model: str | None, tmp_path: Path) -> None:
    secret = write_note(tmp_path)
    final = f"The note is read: done-{uuid.uuid4().hex[:8]}."
    engine = ToolLoopEngine(tool=client.tool, arguments=client.arguments, secret=secret,
                            final=final)  # fmt: skip
    with serving(engine) as url, logging_proxy(url) as (proxy_url, proxy):
        done = run(client, proxy_url, tmp_path, model=model)
    why = explain(proxy, done)
    assert not proxy.refused(), why
    assert len(proxy.requests_to(client.path)) >= 2, why  # the call, then the answer
    assert engine.saw_tool_result(), why  # the tool's output reached the next prompt
    assert final in done.stdout and done.returncode == 0, why


@pytest.fixture(scope="module")
def kvserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """kvserve on the real default model, two slots of a 32k context: the clients' first
    prompts (Claude Code's about 19k tokens, Qwen Code's 16k, Codex's 6k) do not fit the
    default 4096, and a prompt that alone overflows is rightly a 400."""
    args = ["--parallel", "2", "--n-ctx", "32768"]
    with running(args, tmp_path_factory.mktemp("kvserve")) as server:
        yield server.url


# On the real model, the clients the issue names: each cold turn prefills 6-19k tokens
# at a 32k context (Claude Code about 3 minutes on the 2-core CI machine). Qwen Code is
# left to the fake engine's tool loop: one turn of it is two requests of 11-14k tokens
# with different heads (its next-speaker check), about 8 minutes there.
ON_THE_MODEL = (CLAUDE, CODEX, OPENCODE)


@pytest.mark.model
@pytest.mark.parametrize("client", ON_THE_MODEL, ids=lambda c: c.name)
def test_a_turn_on_the_default_model(client: Client, kvserve: str, tmp_path: Path) -> None:
    """One turn of each client on the real model, with the client's own model name and
    a small output limit where the client has a setting for one. Its tools are offered
    but do not run without asking: the model may ask for any command."""
    write_note(tmp_path)
    with logging_proxy(kvserve) as (proxy_url, proxy):
        done = run(client, proxy_url, tmp_path, model=None, max_tokens=48, tools=False,
                   prompt="Say hello in one short sentence.", timeout=420)  # fmt: skip
    why = explain(proxy, done)
    assert not proxy.refused(), why
    assert proxy.requests_to(client.path), why
    # The model may use up the small output limit (it samples at the client's
    # temperature): Claude Code then reports its own error and exits 1 after each
    # request was answered in full. That is the client's rule, not a refusal by kvserve.
    assert done.returncode == 0 or "output token maximum" in done.stdout, why


# A long cold prefill, shrunk: every answer of the fake engine starts PREFILL_S late, and
# Codex drops a stream that sends no event for IDLE_MS (its default is 300 s, which a
# 15-20k-token prompt can take on a small CPU). kvserve's heartbeat (sse.HEARTBEAT_S, a
# `response.in_progress` event) must keep it fed: IDLE_MS is below the delay and above
# the heartbeat, with room for a loaded machine.
PREFILL_S = 15.0
IDLE_MS = 8000


def codex_with_idle_timeout(idle_ms: int, *, max_retries: int | None = None) -> Client:
    """Codex with its provider's `stream_idle_timeout_ms` (and `stream_max_retries`)
    set: keys of `[model_providers.kvserve]`, the last table the pinned Codex's config
    has (tests/helpers/agent_clients.py), so the lines are appended to it."""

    def command(s: Setup) -> tuple[list[str], dict[str, str]]:
        argv, env = CODEX.command(s)
        config = Path(env["CODEX_HOME"]) / "config.toml"
        tables = [line for line in config.read_text().splitlines() if line.startswith("[")]
        assert tables[-1] == "[model_providers.kvserve]", tables
        lines = [f"stream_idle_timeout_ms = {idle_ms}"]
        if max_retries is not None:
            lines.append(f"stream_max_retries = {max_retries}")
        with config.open("a") as f:
            f.write("\n".join(lines) + "\n")
        return argv, env

    return dataclasses.replace(CODEX, command=command)


def test_codex_waits_through_a_long_prefill(tmp_path: Path) -> None:
    """Both requests of the tool loop wait PREFILL_S for their first token, three times
    Codex's idle timeout: the heartbeats keep the streams alive, so each request is sent
    once (a retry would send the same body again) and the turn completes."""
    secret = write_note(tmp_path)
    final = f"The note is read: done-{uuid.uuid4().hex[:8]}."
    client = codex_with_idle_timeout(IDLE_MS)
    engine = ToolLoopEngine(tool=client.tool, arguments=client.arguments, secret=secret,
                            final=final, prefill_delay=PREFILL_S)  # fmt: skip
    with serving(engine) as url, logging_proxy(url) as (proxy_url, proxy):
        done = run(client, proxy_url, tmp_path, model=FAKE_MODEL)
    why = explain(proxy, done)
    assert not proxy.refused(), why
    bodies = [e.body for e in proxy.requests_to(client.path)]
    assert len(bodies) >= 2, why  # the call, then the answer
    assert len(set(bodies)) == len(bodies), why  # no request sent twice
    assert "idle timeout" not in done.stdout, why
    assert final in done.stdout and done.returncode == 0, why


def test_codex_idle_timeout_is_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: without kvserve's heartbeat the same delay trips the same Codex
    watchdog (no retries: it gives up at once), so the test above proves the heartbeat,
    not a setting Codex ignores."""
    monkeypatch.setattr(sse, "HEARTBEAT_S", 3600.0)
    secret = write_note(tmp_path)
    client = codex_with_idle_timeout(IDLE_MS, max_retries=0)
    engine = ToolLoopEngine(tool=client.tool, arguments=client.arguments, secret=secret,
                            final="never", prefill_delay=PREFILL_S)  # fmt: skip
    with serving(engine) as url, logging_proxy(url) as (proxy_url, proxy):
        done = run(client, proxy_url, tmp_path, model=FAKE_MODEL, timeout=120)
    why = explain(proxy, done)
    assert "idle timeout waiting for SSE" in done.stdout, why
    assert done.returncode != 0 and not engine.saw_tool_result(), why
