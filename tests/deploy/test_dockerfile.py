"""Deployment files that no other test runs.

The Dockerfile cannot be built here (no registry access for base images), so its
structure is checked instead: a change that breaks one of these rules fails CI. The
nginx example of docs/deployment.md must be the config the nginx end-to-end test runs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse(text: str) -> list[Stage]:
    """Instructions per stage, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)", rest, re.IGNORECASE)
            stages.append(Stage(match.group(1) if match else str(len(stages))))
        if stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


STAGES = parse(DOCKERFILE.read_text())
BUILDER, RUNTIME = STAGES[0], STAGES[-1]


def test_two_stages_and_the_runtime_copies_only_built_wheels() -> None:
    assert len(STAGES) == 2
    # the runtime takes nothing from the builder but its wheels, mounted for the install
    # step (a COPY --from would be a layer of its own, kept in the image)
    assert not [a for a in RUNTIME.args("COPY") if a.startswith("--from=")]
    mounts = re.findall(r"--mount=(\S+)", " ".join(RUNTIME.args("RUN")))
    assert mounts == [f"type=bind,from={BUILDER.name},source=/wheels,target=/tmp/wheels"]
    assert any("pip wheel" in a for a in BUILDER.args("RUN"))
    assert any("--no-index" in a for a in RUNTIME.args("RUN"))


def test_no_compiler_in_the_runtime_stage() -> None:
    runs = " ".join(RUNTIME.args("RUN"))
    for tool in ("build-essential", "gcc", "g++", "cmake", "clang", "make "):
        assert tool not in runs, f"{tool} is installed in the runtime stage"
    assert "cmake" in " ".join(BUILDER.args("RUN"))


def test_runs_as_a_non_root_user() -> None:
    users = RUNTIME.args("USER")
    assert users, "no USER in the runtime stage: the server would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # the user is created in that stage, before it is switched to
    assert re.search(rf"useradd .*\b{re.escape(user)}\b", " ".join(RUNTIME.args("RUN")))


def _exposed_port() -> str:
    (exposed,) = RUNTIME.args("EXPOSE")
    return exposed.split("/")[0]


def test_healthcheck_asks_health_on_the_exposed_port_with_a_tool_the_image_has() -> None:
    (check,) = RUNTIME.args("HEALTHCHECK")
    assert "CMD" in check
    # the port the server listens on: KVSERVE_SERVER_PORT, else the exposed one
    assert "http://127.0.0.1:{port}/health" in check
    assert f"os.environ.get('KVSERVE_SERVER_PORT', '{_exposed_port()}')" in check
    command = json.loads(check[check.index("CMD") + 3 :].strip())
    # python is in the base image; curl or wget would have to be installed in this stage
    assert command[0] == "python" or command[0] in " ".join(RUNTIME.args("RUN"))


def test_server_listens_on_all_interfaces_at_the_exposed_port() -> None:
    env = " ".join(RUNTIME.args("ENV"))
    assert "KVSERVE_SERVER_HOST=0.0.0.0" in env
    assert f"KVSERVE_SERVER_PORT={_exposed_port()}" in env


def test_cache_directory_is_a_volume_owned_by_the_user() -> None:
    (volume,) = RUNTIME.args("VOLUME")
    (path,) = json.loads(volume)
    runs = " ".join(RUNTIME.args("RUN"))
    assert f"mkdir -p {path}" in runs and f"chown kvserve:kvserve {path}" in runs
    # ... and the cache's disk tier is configured to live there
    assert f"KVSERVE_CACHE_DISK_DIR={path}" in " ".join(RUNTIME.args("ENV"))
    # ... and the hub cache (pulled models), so replicas sharing the volume share those
    # (issue 28 item 18; deploy/ mounts one volume there on every replica)
    assert f"HF_HUB_CACHE={path}/hub" in " ".join(RUNTIME.args("ENV"))


def test_exactly_one_server_process() -> None:
    (entrypoint,) = RUNTIME.args("ENTRYPOINT")
    assert json.loads(entrypoint) == ["kvserve"]  # server.process.serve runs uvicorn, workers=1
    text = DOCKERFILE.read_text()
    assert "--workers" not in text and "gunicorn" not in text
    assert not RUNTIME.args("CMD") or "workers" not in RUNTIME.args("CMD")[0]


def test_the_server_runs_one_uvicorn_worker() -> None:
    source = (ROOT / "server" / "process" / "serve.py").read_text()
    assert re.search(r"workers=1\b", source)


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "tests"):
        assert entry in ignored
    # and nothing the builder stage copies is ignored
    copied = [a.split()[0] for a in BUILDER.args("COPY")]
    assert not set(copied) & set(ignored)


def test_docs_show_the_tested_nginx_config_verbatim() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    blocks = re.findall(r"```nginx\n(.*?)```", page, re.DOTALL)
    config = (ROOT / "tests" / "e2e" / "nginx" / "kvserve.conf").read_text()
    assert blocks == [config]
