"""deploy/: the docker-compose stack (two replicas, nginx, Redis, Prometheus, Grafana).

Checked with the real tools that accept or refuse these files without running them:
docker compose (or Debian's docker-compose) reads the compose file, promtool the
Prometheus config. That the dashboard's PromQL names only metrics kvserve exposes is
checked against live replicas in tests/e2e/test_scale_out.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


@pytest.fixture(scope="module")
def resolved() -> dict:
    """The compose file as docker compose itself resolves it (anchors, paths)."""
    command = compose_command()
    if command is None:
        pytest.skip("neither docker-compose nor docker compose is installed (.ci/run installs it)")
    run = subprocess.run(
        [*command, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return yaml.safe_load(run.stdout)  # type: ignore[no-any-return]


def mounts(service: dict) -> dict[str, str]:
    """target -> source of a service's volumes, in either syntax compose prints
    (docker-compose 1.x: "source:target:mode"; docker compose 2.x: mappings)."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        out[target] = source
    return out


def test_compose_runs_two_replicas_behind_nginx_with_redis_prometheus_grafana(
    resolved: dict,
) -> None:
    services = resolved["services"]
    assert set(services) == {"kvserve-1", "kvserve-2", "redis", "nginx", "prometheus", "grafana"}
    for name in ("kvserve-1", "kvserve-2"):
        replica = services[name]
        assert replica["build"]["context"] == str(ROOT)
        env = replica["environment"]
        assert env["KVSERVE_CACHE_SHARED_URL"] == "redis://redis:6379/0"
        # one cache volume for both: the disk tier is safe on a shared directory
        assert mounts(replica) == {"/var/cache/kvserve": "kvserve-cache"}
    assert "allkeys-lru" in services["redis"]["command"]


def test_nginx_in_compose_is_the_tested_affinity_config(resolved: dict) -> None:
    assert (DEPLOY / "nginx" / "kvserve.conf").read_text() == (
        ROOT / "tests" / "e2e" / "nginx" / "kvserve.conf"
    ).read_text()
    assert mounts(resolved["services"]["nginx"])["/etc/nginx/conf.d/kvserve.conf"] == str(DEPLOY / "nginx" / "kvserve.conf")
    upstreams = (DEPLOY / "nginx" / "kvserve.conf").read_text()
    for name in ("kvserve-1", "kvserve-2"):
        assert f"server {name}:8080;" in upstreams


def test_prometheus_scrapes_every_replica_and_promtool_accepts_it(resolved: dict) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    replicas = {s for s in resolved["services"] if s.startswith("kvserve-")}
    assert targets == {f"{r}:8080" for r in replicas}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    run = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_grafana_provisions_the_datasource_and_the_dashboard(resolved: dict) -> None:
    grafana = mounts(resolved["services"]["grafana"])
    provisioning = Path(grafana["/etc/grafana/provisioning"])
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "kvserve.yml").read_text())[
        "providers"
    ]
    dashboards = Path(grafana[provider["options"]["path"]])
    dashboard = json.loads((dashboards / "kvserve.json").read_text())
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for wanted in ("first token", "inter-token", "end-to-end", "tokens per second",
                   "hit ratio per tier", "slots", "queue", "429"):
        assert wanted in titles, wanted
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
