"""The project's Docker image, built and run (tests/e2e/docker_daemon.py: a private
dockerd, a debootstrapped Debian base, the real Dockerfile).

One container after the other on one cache volume (host networking: the daemon runs
with --bridge=none, so the container's port is the host's):
- it runs as the non-root user, /health goes 503 -> 200, Docker's health becomes healthy;
- the openai SDK gets a chat answer, and its trace reaches a real OTLP receiver on the
  host (the image carries the `tracing` extra);
- `docker stop` drains: a stream in flight finishes, the container exits 0 in its grace;
- `docker rm`, a new container on the same volume: the long prompt is warm from disk.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.docker_daemon import (
    IMAGE,
    Docker,
    base_context,
    build_base,
    build_image,
    check_free_space,
    daemon,
    ensure_debootstrap,
    image_context,
    image_digest,
    inputs_digest,
    missing_tools,
    prune,
)
from tests.helpers.exact import reused
from tests.kvserve_process import MODEL, free_port
from tests.otlp_receiver import Receiver, running_receiver

pytestmark = [pytest.mark.model, pytest.mark.docker]

RULES = " ".join(f"Rule {i}: parcels for zone {i % 9} leave at {i % 12 + 1}." for i in range(30))
LONG = [{"role": "system", "content": RULES}, {"role": "user", "content": "When does zone 3 leave?"}]
CONTAINERS = ("kvserve-test-1", "kvserve-test-2")


@dataclass
class Setup:
    docker: Docker
    volume: str
    log_dir: Path
    build_s: float


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    why = missing_tools()
    if why is not None:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("docker")
    with daemon(work) as docker:
        docker.run("rm", "-f", *CONTAINERS, check=False)  # what an interrupted run left
        base, context = base_context(work), image_context(work)
        built = image_digest(docker) != inputs_digest(docker, base, context)
        try:
            build_s = 0.0
            if built:  # else the image there was built from these very files: used as it is
                prune(docker, keep_image=False)
                check_free_space()
                ensure_debootstrap(docker, work)
                build_base(docker, base)
                build_s = build_image(docker, context, inputs_digest(docker, base, context))
            print(f"\ndocker: image {f'built in {build_s:.0f}s' if built else 'unchanged'}")
            volume = f"kvserve-test-cache-{uuid.uuid4().hex[:8]}"
            docker.run("volume", "create", volume)
            try:
                yield Setup(docker, volume, work, build_s)
            finally:
                docker.run("rm", "-f", *CONTAINERS, check=False)
                docker.run("volume", "rm", "-f", volume, check=False)
        finally:
            if built:  # the build's leftovers; the image stays for the next run
                prune(docker, keep_image=True)


def start(setup: Setup, name: str, env: tuple[str, ...] = ()) -> str:
    """A container of the image on the cache volume; its URL (host networking).
    `env`: more KEY=VALUE settings."""
    port = free_port()
    setup.docker.run(
        "run", "-d", "--name", name, "--network", "host",
        "-v", f"{setup.volume}:/var/cache/kvserve",
        "-e", f"KVSERVE_SERVER_PORT={port}", "-e", "KVSERVE_SERVER_HOST=127.0.0.1",
        "-e", "KVSERVE_ENGINE_N_CTX=1024", "-e", "KVSERVE_ENGINE_N_SEQ_MAX=2",
        "-e", "KVSERVE_ENGINE_EMBEDDINGS=false", "-e", "KVSERVE_ENGINE_N_THREADS=1",
        "-e", "KVSERVE_ENGINE_EXACT_REUSE=true",  # a warm reply must equal the cold one
        "--health-interval", "2s",  # the image's check, asked more often than in production
        *(arg for item in env for arg in ("-e", item)),
        IMAGE,
    )
    return f"http://127.0.0.1:{port}"


def wait_health(setup: Setup, name: str, url: str) -> list[int]:
    """Poll /health until 200; the statuses seen on the way (connection refused: 0)."""
    seen: list[int] = []
    deadline = time.monotonic() + 300
    while not seen or seen[-1] != 200:
        state = setup.docker.inspect(name, "{{.State.Status}}")
        assert state == "running", setup.docker.run("logs", name).stdout[-3000:]
        try:
            status = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.HTTPError:
            status = 0
        if not seen or seen[-1] != status:
            seen.append(status)
        assert time.monotonic() < deadline, seen
        time.sleep(0.02)
    return seen


def chat_long(url: str) -> tuple[str, int, int]:
    body = {"model": MODEL, "messages": LONG, "max_tokens": 12, "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    usage = reply["usage"]
    return (reply["choices"][0]["message"]["content"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def first(setup: Setup, receiver: Receiver) -> Iterator[tuple[str, str]]:
    name = "kvserve-test-1"
    url = start(setup, name, (f"KVSERVE_TRACING_OTLP_ENDPOINT={receiver.url}",))
    seen = wait_health(setup, name, url)
    setup.log_dir.joinpath("health-1.txt").write_text(str(seen))
    yield name, url


def test_the_container_runs_as_a_user_and_becomes_healthy(
    setup: Setup, first: tuple[str, str]
) -> None:
    name, url = first
    seen = [int(s) for s in setup.log_dir.joinpath("health-1.txt").read_text()[1:-1].split(",")]
    assert 503 in seen and seen[-1] == 200 and seen.index(503) < len(seen) - 1, seen
    pid = setup.docker.inspect(name, "{{.State.Pid}}")
    status = Path(f"/proc/{pid}/status").read_text()
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert uid == "10001"  # the image's kvserve user, not root
    assert setup.docker.inspect(name, "{{.Config.User}}") == "kvserve:kvserve"
    deadline = time.monotonic() + 120
    while (health := setup.docker.inspect(name, "{{.State.Health.Status}}")) != "healthy":
        assert health in ("starting", "healthy"), health
        assert time.monotonic() < deadline, health
        time.sleep(0.5)


def test_the_openai_sdk_chats_with_the_container_and_traces_it(
    first: tuple[str, str], receiver: Receiver
) -> None:
    _, url = first
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    deadline = time.monotonic() + 30  # spans are exported in batches, every few seconds
    while not receiver.named("POST /v1/chat/completions"):
        assert time.monotonic() < deadline, [s.name for s in receiver.spans]
        time.sleep(0.2)
    (http,) = receiver.named("POST /v1/chat/completions")
    (generate,) = receiver.named("kvserve.generate")
    assert generate.trace_id == http.trace_id and generate.parent_id == http.span_id


def test_docker_stop_drains_then_a_new_container_is_warm_from_the_volume(
    setup: Setup, first: tuple[str, str]
) -> None:
    name, url = first
    cold, prompt_tokens, cached = chat_long(url)
    assert cached < 64 and prompt_tokens > 300
    # A stream in flight when `docker stop` sends SIGTERM finishes within the grace.
    events: list[str] = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 64, "ignore_eos": True, "stream": True}

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))

    reader = threading.Thread(target=stream)
    reader.start()
    while not events:
        time.sleep(0.01)
    start_stop = time.monotonic()
    setup.docker.run("stop", "-t", "60", name, timeout=120)
    stop_s = time.monotonic() - start_stop
    reader.join(60)
    assert events[-1] == "[DONE]" and '"finish_reason":"length"' in events[-2].replace(" ", "")
    assert setup.docker.inspect(name, "{{.State.ExitCode}}") == "0"
    assert stop_s < 60  # drained, not killed at the end of the grace
    setup.docker.run("rm", name)

    second = "kvserve-test-2"
    url = start(setup, second)
    wait_health(setup, second, url)
    warm, _, cached = chat_long(url)
    assert warm == cold
    assert cached == reused(prompt_tokens)  # from the volume's disk tier (the last 64+ again)
    logs = setup.docker.run("logs", second).stdout + setup.docker.run("logs", second).stderr
    assert "cache: disk tier at /var/cache/kvserve/" in logs
    setup.docker.run("stop", "-t", "60", second, timeout=120)
    print(f"\ndocker: stop drained in {stop_s:.1f}s; warm restart cached {cached}/{prompt_tokens}")
