"""The agent programs people run, driven non-interactively against a kvserve URL.

Each client is installed at the versions pinned in tests/e2e/agents/ (install.sh, shared
with .ci/run) and run in a temporary HOME of its own, pointed at kvserve the way its
documentation says (docs/clients.md), with nothing else configured. No client reaches
the internet in these runs: telemetry, update checks and model catalogues are off, and
anything else meets a proxy that is not there.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENTS_DIR = Path(__file__).resolve().parents[1] / "e2e" / "agents"
KEY = "sk-agent-clients"  # any key: the test servers check none unless told
NO_PROXY_THERE = "http://127.0.0.1:9"  # the discard port: refused at once
PROMPT = "Run `cat note.txt` with your shell tool, then tell me what the note says."


@dataclass(frozen=True)
class Setup:
    """What one client run is given."""

    bins: Path  # the pinned clients' executables
    url: str  # kvserve's base URL, no /v1
    model: str | None  # None: the client's own default model name
    cwd: Path  # where it works (note.txt lies there)
    home: Path  # its HOME, empty at first
    max_tokens: int | None  # an output limit set through the client's own setting
    prompt: str
    tools: bool  # whether its shell and editing tools run without asking (else refused)


# A client's argv and extra environment for a run (its configuration files written).
Command = Callable[[Setup], tuple[list[str], dict[str, str]]]


@functools.cache
def bin_dir() -> Path:
    """Where the pinned clients' executables are (installed on first use, minutes)."""
    done = subprocess.run([str(AGENTS_DIR / "install.sh")], check=True, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def _claude(s: Setup) -> tuple[list[str], dict[str, str]]:
    # -p mode refuses a tool that is not allowed (nobody is there to ask).
    argv = [str(s.bins / "claude"), "-p", s.prompt]
    if s.tools:
        argv += ["--allowedTools", "Bash"]
    if s.model:
        argv += ["--model", s.model]
    env = {"ANTHROPIC_BASE_URL": s.url, "ANTHROPIC_API_KEY": KEY,
           # no telemetry, error reports, update checks or feedback surveys
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1"}  # fmt: skip
    if s.max_tokens:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(s.max_tokens)
    return argv, env


def _codex(s: Setup) -> tuple[list[str], dict[str, str]]:
    # A provider of one's own: Codex speaks only the Responses API (it refuses
    # wire_api "chat"). Codex sends no output limit, so max_tokens has no setting here.
    codex_home = s.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    lines = [f'model = "{s.model}"'] if s.model else []
    lines += ['model_provider = "kvserve"', "", "[model_providers.kvserve]",
              'name = "kvserve"', f'base_url = "{s.url}/v1"', 'wire_api = "responses"',
              'env_key = "KVSERVE_API_KEY"']  # fmt: skip
    (codex_home / "config.toml").write_text("\n".join(lines) + "\n")
    # `codex exec` never asks for approval; its read-only sandbox still runs `cat` and
    # writes nothing, so `tools` changes nothing here.
    argv = [str(s.bins / "codex"), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
            s.prompt]  # fmt: skip
    return argv, {"CODEX_HOME": str(codex_home), "KVSERVE_API_KEY": KEY}


def _opencode(s: Setup) -> tuple[list[str], dict[str, str]]:
    # opencode has no default model for a provider of one's own: the model is named.
    name = s.model or "kvserve-default"
    model: dict[str, Any] = {"name": name}
    if s.max_tokens:
        model["limit"] = {"context": 32768, "output": s.max_tokens}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"kvserve": {
            "npm": "@ai-sdk/openai-compatible", "name": "kvserve",
            "options": {"baseURL": f"{s.url}/v1", "apiKey": KEY},
            "models": {name: model}}},
        "model": f"kvserve/{name}",
        "autoupdate": False,
        "share": "disabled",
    }  # fmt: skip
    if not s.tools:  # opencode runs its tools without asking unless told otherwise
        config["permission"] = {"bash": "deny", "edit": "deny", "webfetch": "deny"}
    (s.cwd / "opencode.json").write_text(json.dumps(config, indent=1))
    argv = [str(s.bins / "opencode"), "run", s.prompt]
    h = s.home
    env = {"XDG_CONFIG_HOME": str(h / ".config"), "XDG_DATA_HOME": str(h / ".local/share"),
           "XDG_CACHE_HOME": str(h / ".cache"), "XDG_STATE_HOME": str(h / ".local/state"),
           "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}  # fmt: skip
    return argv, env


def _qwen(s: Setup) -> tuple[list[str], dict[str, str]]:
    # --yolo: tools run without asking; without it a headless run refuses them.
    argv = [str(s.bins / "qwen"), "-p", s.prompt] + (["--yolo"] if s.tools else [])
    env = {"OPENAI_BASE_URL": f"{s.url}/v1", "OPENAI_API_KEY": KEY,
           "OPENAI_MODEL": s.model or "kvserve-default",
           "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}  # fmt: skip
    if s.max_tokens:
        env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(s.max_tokens)
    return argv, env


@dataclass(frozen=True)
class Client:
    name: str
    path: str  # the API route its turns go to
    tool: str  # its shell tool, as the model calls it
    arguments: dict[str, Any]  # that call's arguments: print note.txt
    command: Command


CLAUDE = Client("claude", "/v1/messages", "Bash",
                {"command": "cat note.txt", "description": "Show the note"}, _claude)  # fmt: skip
CODEX = Client("codex", "/v1/responses", "exec_command", {"cmd": "cat note.txt"}, _codex)
OPENCODE = Client("opencode", "/v1/chat/completions", "bash",
                  {"command": "cat note.txt", "description": "Show the note"}, _opencode)  # fmt: skip
QWEN = Client("qwen", "/v1/chat/completions", "run_shell_command",
              {"command": "cat note.txt", "description": "Show the note"}, _qwen)  # fmt: skip
CLIENTS = (CLAUDE, CODEX, OPENCODE, QWEN)
# Codex with its own default model sends its tools as an `additional_tools` input item:
# namespaces, the shell reachable only from `functions.exec`, a `custom` tool whose input
# is JavaScript (a Lark grammar) calling the others. kvserve shows a namespace's member as
# `<namespace>__<name>` and a custom tool's input as the string parameter `input`.
CODEX_OWN_MODEL = Client("codex", "/v1/responses", "functions__exec",
                         {"input": 'text(await tools.exec_command({cmd: "cat note.txt"}));'},
                         _codex)  # fmt: skip


def run(client: Client, url: str, root: Path, *, model: str | None,
        max_tokens: int | None = None, prompt: str = PROMPT, tools: bool = True,
        timeout: float = 240) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`client` run once in root/work (note.txt there is the caller's) with root/home
    as its HOME; its stdout and stderr together are the result's stdout. `tools`: its
    shell runs without asking (only for a scripted model: a real one may ask for any
    command)."""
    cwd, home = root / "work", root / "home"
    cwd.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    argv, extra = client.command(Setup(bin_dir(), url, model, cwd, home, max_tokens, prompt, tools))
    # Only what a client needs from the outer environment: no keys or configuration of
    # the machine's own user leak in. Everything but loopback goes to a proxy that is not
    # there, so a run never depends on the internet (opencode tries to npm-install its
    # plugin package at start, and carries on without it).
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1",
           "HTTP_PROXY": NO_PROXY_THERE, "HTTPS_PROXY": NO_PROXY_THERE,
           "NO_PROXY": "127.0.0.1,localhost", **extra}  # fmt: skip
    try:
        return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as exc:  # the test then shows the traffic so far
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return subprocess.CompletedProcess(argv, -9, f"{out}\n[timed out after {timeout} s]")
