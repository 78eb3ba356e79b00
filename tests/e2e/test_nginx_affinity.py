"""The README's nginx example, for real: two kvserve replicas behind Debian's nginx.

A session's turns (X-Kvserve-Session) all land on one replica, whose cached prefix grows
turn after turn; requests without a session spread across both replicas. A replica is
told apart by its own /metrics: the one whose generated-token counter moved served
the request (requests are sent one at a time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.kvserve_process import (
    MODEL,
    Server,
    free_port,
    metrics,
    running,
    terminate,
    wait_ready,
)

pytestmark = pytest.mark.model

CONFIG = Path(__file__).parent / "nginx" / "kvserve.conf"
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
)
GENERATED = "kvserve_generated_tokens_total"


def template(replicas: list[str], port: int) -> str:
    """The example config with the replicas and the listening port of this test."""
    text = CONFIG.read_text()
    for i, url in enumerate(replicas, start=1):
        placeholder = f"server kvserve-{i}:8080;"
        assert text.count(placeholder) == 1
        text = text.replace(placeholder, f"server {url.removeprefix('http://')};")
    assert text.count("listen 8080;") == 1
    return text.replace("listen 8080;", f"listen 127.0.0.1:{port};")


def main_config(prefix: Path) -> str:
    """A top-level nginx.conf that keeps every path (pid, logs, temp files) in `prefix`."""
    user = "user root root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(
        f"    {kind}_temp_path {prefix}/tmp-{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {prefix}/nginx.pid;\n"
        f"error_log {prefix}/error.log info;\n"
        "events { worker_connections 256; }\n"
        f"http {{\n    access_log {prefix}/access.log;\n{temp}\n"
        f"    include {prefix}/kvserve.conf;\n}}\n"
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Server]]]:
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run does it)")
    tmp = tmp_path_factory.mktemp("nginx")
    args = [
        "--parallel",
        "2",
        "--n-ctx",
        "1024",
        "--threads",
        "1",
    ]  # one thread: see reliability/conftest.py
    with ExitStack() as stack:
        # start both replicas first, then wait: their model loads overlap
        replicas = [stack.enter_context(running(args, tmp, wait=False)) for _ in range(2)]
        for replica in replicas:
            wait_ready(replica)
        url = start_nginx(tmp, [r.url for r in replicas], stack)
        yield url, replicas


def start_nginx(tmp: Path, replicas: list[str], stack: ExitStack) -> str:
    """Debian's nginx in front of `replicas` with deploy/nginx's affinity config, its
    files under `tmp`, stopped when `stack` closes; its URL once it answers /health."""
    assert NGINX is not None
    port = free_port()
    (tmp / "kvserve.conf").write_text(template(replicas, port))
    (tmp / "nginx.conf").write_text(main_config(tmp))
    files = ["-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")]
    check = subprocess.run([NGINX, "-t", *files], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    nginx = subprocess.Popen([NGINX, *files], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(terminate, nginx, 15)  # SIGTERM: nginx's fast shutdown
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert nginx.poll() is None, (tmp / "error.log").read_text()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "nginx did not come up"
        time.sleep(0.1)


def _served_by(replicas: list[Server], before: list[float]) -> int:
    """Index of the one replica whose generated-token counter moved."""
    after = [metrics(r.url)[GENERATED] for r in replicas]
    moved = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
    assert len(moved) == 1, (before, after)
    return moved[0]


def _chat(
    http: httpx.Client, url: str, messages: list[dict[str, str]], session: str | None
) -> dict:
    headers = {"X-Kvserve-Session": session} if session else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_sessions_turns_stay_on_one_replica_and_reuse_its_cache(
    cluster: tuple[str, list[Server]],
) -> None:
    url, replicas = cluster
    with httpx.Client(timeout=60) as http:
        for session in ("conversation-a", "conversation-b", "conversation-c"):
            # long enough (64+ tokens) for its prefix to be found in the prefix cache
            rules = " ".join(f"Rule {i}: answer with one number only." for i in range(12))
            messages = [{"role": "system", "content": f"You are helper {session}. {rules}"}]
            homes, cached = [], []
            for turn in range(4):
                messages.append({"role": "user", "content": f"Turn {turn}: name a number."})
                before = [metrics(r.url)[GENERATED] for r in replicas]
                reply = _chat(http, url, messages, session)
                homes.append(_served_by(replicas, before))
                cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
                answer = reply["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": answer})
            assert len(set(homes)) == 1, homes
            # each turn extends the previous conversation: its prefix is found on the replica
            assert cached == sorted(set(cached)), cached  # strictly increasing


def test_requests_without_a_session_spread_across_replicas(
    cluster: tuple[str, list[Server]],
) -> None:
    url, replicas = cluster
    served = [0, 0]
    with httpx.Client(timeout=60) as http:
        for i in range(16):
            before = [metrics(r.url)[GENERATED] for r in replicas]
            _chat(http, url, [{"role": "user", "content": f"Say {i}."}], None)
            served[_served_by(replicas, before)] += 1
    # a fair split of 16 puts every request on one replica with probability 2 * 2**-16
    assert min(served) >= 1, served


def test_streaming_passes_through_the_balancer(cluster: tuple[str, list[Server]]) -> None:
    url, _ = cluster
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 24,
        "stream": True,
        "ignore_eos": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"X-Kvserve-Session": "s"}
        ) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert len(events) >= 10  # one chunk per token or so, not one buffered blob
