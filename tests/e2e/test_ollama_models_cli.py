"""Ollama's model management through the real `ollama` client, and the `kvserve` model
commands in a pseudo-terminal, against a real server process and a hub stand-in on
loopback (HF_ENDPOINT): list, ps, version, pull with progress, then served, copy,
delete, unknown names; pull/ls/ps/rm/run on the terminal."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from server.config.tree import default_model_path
from tests.helpers.hub_standin import HubFile, StandIn, serving
from tests.kvserve_process import MODEL, Server, free_port, running

pytestmark = pytest.mark.model

REPO = "kvtest/SmolLM2-135M-Instruct-GGUF"
PULLED = f"hf.co/{REPO}:Q4_1"
AUTH = {"Authorization": "Bearer k"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@pytest.fixture(scope="module")
def hub() -> Iterator[StandIn]:
    files = {"SmolLM2-135M-Instruct.Q4_1.gguf": HubFile(Path(default_model_path()))}
    with serving(StandIn({REPO: files})) as stand_in:
        yield stand_in


def _env(hub: StandIn, cache: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


@pytest.fixture(scope="module")
def server(hub: StandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("ollama")
    # A small context bounds an answer (the commands send no max_tokens): a slow machine
    # finishes one in time.
    args = ["--parallel", "2", "--threads", "2", "--n-ctx", "256"]
    env = {**_env(hub, tmp / "hf"), "KVSERVE_AUTH_ADMIN_API_KEYS": "k"}  # pull, rm: admin
    with running(args, tmp, env=env) as s:
        yield s


def _chat(url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_the_ollama_client_manages_models(server: Server, hub: StandIn) -> None:
    with ollama.Client(host=server.url, headers=AUTH) as client:
        names = [m.model for m in client.list().models]
        assert names == [f"{MODEL}:latest"]
        loaded = client.ps().models
        assert [m.model for m in loaded] == [f"{MODEL}:latest"]
        assert loaded[0].expires_at is not None and loaded[0].context_length
        assert loaded[0].size and loaded[0].details and loaded[0].details.family == "llama"
        version = httpx.get(f"{server.url}/api/version", headers=AUTH).json()["version"]
        assert re.fullmatch(r"\d+\.\d+\.\d+.*", version)

        progress = list(client.pull(PULLED, stream=True))
        assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
        sizes = [p for p in progress if p.total]
        assert sizes and sizes[-1].completed == sizes[-1].total == os.path.getsize(
            default_model_path()
        )
        assert hub.downloads == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
        assert PULLED in [m.model for m in client.list().models]
        assert _chat(server.url, PULLED)  # loaded by its first request, no restart
        assert PULLED in [m.model for m in client.ps().models]

        assert client.copy(PULLED, "smol-copy").status == "success"
        assert _chat(server.url, "smol-copy")
        assert client.delete("smol-copy").status == "success"
        assert client.delete(PULLED).status == "success"
        assert PULLED not in [m.model for m in client.list().models]
        assert not list((Path(server.log_path).parent / "hf").glob("**/models--kvtest--*"))

        for call, status in (
            (lambda: client.delete("nope"), 404),
            (lambda: client.copy("nope", "x"), 404),
            (lambda: client.delete(MODEL), 400),  # configured: not deletable
            (lambda: client.pull("llama3.2"), 400),
            (lambda: client.pull("hf.co/kvtest/missing:Q4_1"), 404),
        ):
            with pytest.raises(ollama.ResponseError) as info:
                call()
            assert info.value.status_code == status and isinstance(info.value.error, str)
    with ollama.Client(host=server.url) as anonymous, pytest.raises(ollama.ResponseError) as info:
        anonymous.list()
    assert info.value.status_code == 401


# -- the CLI in a pseudo-terminal --------------------------------------------------------


class Terminal:
    """A `kvserve` command on a pseudo-terminal (stdin, stdout and stderr)."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.master, slave = os.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "server", *args],
            stdin=slave, stdout=slave, stderr=slave, close_fds=True,
            env={**os.environ, "COLUMNS": "160", "TERM": "xterm", **env},
        )  # fmt: skip
        os.close(slave)
        self.output = ""

    def expect(self, text: str, timeout: float = 300) -> str:
        """Read until `text` appears (once more than it has so far)."""
        deadline = time.monotonic() + timeout
        seen = self.clean.count(text)
        while self.clean.count(text) <= seen:
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.clean}"
            if not self._read(0.2) and self.process.poll() is not None:
                raise AssertionError(
                    f"exited {self.process.returncode} before {text!r}:\n{self.clean}"
                )
        return self.clean

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def wait(self, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            assert time.monotonic() < deadline, self.clean
            self._read(0.2)
        while self._read(0.05):
            pass
        os.close(self.master)
        return self.process.returncode

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the other end is closed
            return False
        self.output += data.decode(errors="replace")
        return bool(data)

    @property
    def clean(self) -> str:
        return _ANSI.sub("", self.output)


def _kvserve(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    term = Terminal(args, env)
    code = term.wait()
    return code, term.clean


def test_cli_pull_ls_ps_run_rm(server: Server, hub: StandIn) -> None:
    env = {"KVSERVE_HOST": server.url, "KVSERVE_API_KEY": "k"}
    code, out = _kvserve(["pull", f"{REPO}:Q4_1"], env)
    assert code == 0, out
    assert "pulling manifest" in out and "success" in out and "MB" in out  # the bar's sizes
    code, out = _kvserve(["ls"], env)
    assert code == 0 and "NAME" in out and PULLED in out and f"{MODEL}:latest" in out, out
    code, out = _kvserve(["run", PULLED, "Say", "hi"], env)
    assert code == 0 and out.strip(), out
    code, out = _kvserve(["ps", "--host", server.url], {"KVSERVE_API_KEY": "k"})
    assert code == 0 and PULLED in out and "Forever" in out, out

    chat = Terminal(["run", f"{MODEL}:latest"], env)
    chat.expect(">>> ")
    for turn, question in enumerate(("What is 2+2?", "And 3+3?"), start=2):
        chat.send(question)
        while chat.clean.count(">>> ") < turn:  # the answer streamed, then the next prompt
            chat.expect(">>> ")
    assert len(chat.clean.split(">>> ")[1].strip().splitlines()) >= 2  # the question, an answer
    chat.send("/bye")
    assert chat.wait() == 0

    code, out = _kvserve(["rm", PULLED], env)
    assert code == 0 and f"deleted '{PULLED}'" in out, out
    code, out = _kvserve(["rm", PULLED], env)
    assert code == 1 and "not found" in out, out
    code, out = _kvserve(["ls"], {"KVSERVE_HOST": server.url})  # no key
    assert code == 1 and "API key" in out, out


def test_cli_pull_without_a_server_fills_the_cache_a_server_serves(
    hub: StandIn, tmp_path: Path
) -> None:
    env = {**_env(hub, tmp_path / "hf"), "KVSERVE_HOST": f"127.0.0.1:{free_port()}"}
    code, out = _kvserve(["pull", f"hf.co/{REPO}:Q4_1"], env)
    assert code == 0 and "local hub cache" in out and "success" in out, out
    with running(["--parallel", "1", "--threads", "2"], tmp_path, env=env) as s:
        names = [m["name"] for m in httpx.get(f"{s.url}/api/tags").json()["models"]]
        assert PULLED in names
        assert _chat(s.url, PULLED.replace("Q4_1", "latest"))  # the repo's only GGUF
