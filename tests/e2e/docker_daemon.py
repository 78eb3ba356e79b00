"""A Docker daemon of the test's own, and the project's image built on it.

Docker Hub is not reachable from CI, but Debian's packages are: `docker.io` gives
dockerd (run here as root with --iptables=false --bridge=none --storage-driver=vfs, so
containers use the host's network), and `debootstrap` a Debian root filesystem that
`docker import` turns into the base image. The project's Dockerfile is then built FROM a
test-only layer over it that carries this machine's CA bundle (pip must trust the
egress proxy); the Dockerfile's own default base stays the public python image.

The daemon's data root persists (KVSERVE_DOCKER_ROOT, default /var/tmp/kvserve-docker)
so the base image and BuildKit's cache (pip's cache mount) survive between runs; the
llama-cpp-python wheel the host already built is handed to the build in .wheels/.
With vfs every layer is a full copy of the filesystem below it, so each run's image and
its superseded build cache cost several GB: `prune` (before a build and after it) keeps
only the base images, the test image and BuildKit's most recently used cache.

The build is skipped when nothing under the image changed: the test image carries a
label with the digest of everything it was built from (the build context, the test base's
Dockerfile and CA bundle, the debootstrapped image's id), and a run whose digest matches
the image's uses it as it is: no base layer, no build, no prune.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.kvserve_process import terminate

ROOT = Path(__file__).resolve().parents[2]
DOCKERD = shutil.which("dockerd")
# Debian's docker.io CLI: it drives the daemon's built-in BuildKit without buildx.
DOCKER = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")
DEBOOTSTRAP = shutil.which("debootstrap")
DATA_ROOT = Path(os.environ.get("KVSERVE_DOCKER_ROOT", "/var/tmp/kvserve-docker"))
DEBOOTSTRAP_IMAGE = "kvserve-debootstrap:bookworm"
BASE_IMAGE = "kvserve-test-base:bookworm"
IMAGE = "kvserve:test"
# The label on IMAGE with the digest of what it was built from (image_digest).
DIGEST_LABEL = "kvserve.test.inputs"
# BuildKit's cache kept between runs (pip's cache mount and the latest layers); more, at
# vfs's full copy per layer, filled a 100 GB disk in about ten runs.
BUILD_CACHE_KEEP = "1500mb"
# Free space the build needs on the data root's disk (the image and its layers as copies).
BUILD_FREE_BYTES = 12 * 2**30
DEBIAN_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
MIRROR = os.environ.get("KVSERVE_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def missing_tools() -> str | None:
    """Why the Docker tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "dockerd needs root"
    for name, path in (("dockerd (docker.io)", DOCKERD), ("docker", DOCKER),
                       ("debootstrap", DEBOOTSTRAP)):
        if path is None:
            return f"{name} is not installed (.ci/run installs it)"
    return None


class Docker:
    def __init__(self, socket: Path) -> None:
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{socket}", "DOCKER_BUILDKIT": "1"}

    def run(self, *args: str, timeout: float = 120, check: bool = True,
            **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert DOCKER is not None
        result = subprocess.run(
            [DOCKER, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            **kwargs,  # type: ignore[call-overload]
        )
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {result.stdout}{result.stderr}")
        return result  # type: ignore[no-any-return]

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0

    def inspect(self, container: str, template: str) -> str:
        return self.run("inspect", "-f", template, container).stdout.strip()


@contextlib.contextmanager
def daemon(log_dir: Path) -> Iterator[Docker]:
    """dockerd on a private socket; stopped (its containers with it) on exit."""
    assert DOCKERD is not None
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="kvd-", dir="/var/tmp"))  # short: socket paths
    socket = run_dir / "docker.sock"
    with open(log_dir / "dockerd.log", "wb") as log:
        process = subprocess.Popen(
            [DOCKERD, "--iptables=false", "--bridge=none", "--storage-driver=vfs",
             "--data-root", str(DATA_ROOT), "--exec-root", str(run_dir / "exec"),
             "--pidfile", str(run_dir / "docker.pid"), "-H", f"unix://{socket}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    docker = Docker(socket)
    try:
        deadline = time.monotonic() + 60
        while docker.run("info", check=False, timeout=10).returncode != 0:
            assert process.poll() is None, (log_dir / "dockerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "dockerd did not come up"
            time.sleep(0.5)
        yield docker
    finally:
        terminate(process, 60)
        # dockerd leaves its default network namespace mounted in the exec root
        netns = run_dir / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", str(netns)], check=False, capture_output=True)
        shutil.rmtree(run_dir, ignore_errors=True)


def prune(docker: Docker, *, keep_image: bool) -> None:
    """Drop dangling images and BuildKit's cache beyond BUILD_CACHE_KEEP, and the test image
    unless `keep_image`; the base images stay (debootstrap takes minutes)."""
    if not keep_image:
        docker.run("image", "rm", "-f", IMAGE, check=False)
    docker.run("image", "prune", "-f")
    docker.run("builder", "prune", "-f", "--keep-storage", BUILD_CACHE_KEEP, timeout=600)


def check_free_space() -> None:
    free = shutil.disk_usage(DATA_ROOT).free
    assert free >= BUILD_FREE_BYTES, (
        f"{free / 2**30:.1f} GiB free on the disk of {DATA_ROOT}; the image build needs "
        f"{BUILD_FREE_BYTES / 2**30:.0f} GiB (vfs copies every layer)"
    )


def ensure_debootstrap(docker: Docker, work: Path) -> None:
    """The debootstrapped Debian, once per data root."""
    if not docker.has_image(DEBOOTSTRAP_IMAGE):
        rootfs = work / "rootfs"
        subprocess.run(
            [str(DEBOOTSTRAP), "--variant=minbase", f"--include={DEBIAN_PACKAGES}",
             "bookworm", str(rootfs), MIRROR],
            check=True, capture_output=True, timeout=1200,
        )
        # `with`: the pipe's read end is closed (not left to the garbage collector, an
        # unclosed file) and tar waited for, whatever `docker import` did
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            docker.run("import", "-", DEBOOTSTRAP_IMAGE, stdin=tar.stdout, timeout=600)
        assert tar.returncode == 0
        shutil.rmtree(rootfs, ignore_errors=True)


def base_context(work: Path) -> Path:
    """The test base's build context: its Dockerfile and this machine's CA bundle."""
    context = work / "base"
    context.mkdir()
    shutil.copy(ROOT / "tests" / "e2e" / "docker" / "base.Dockerfile", context / "Dockerfile")
    shutil.copy(ca_bundle(), context / "ca-certificates.crt")
    return context


def build_base(docker: Docker, context: Path) -> None:
    """The CA layer over the debootstrapped Debian (BASE_IMAGE)."""
    docker.run("build", "--network", "host", "-t", BASE_IMAGE, str(context), timeout=600)


def ca_bundle() -> str:
    """The CA file this machine trusts (its egress proxy's CA included)."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise AssertionError("no CA bundle found")


def host_wheels() -> list[str]:
    """llama-cpp-python wheels pip already built on this host (its wheel cache)."""
    pattern = os.path.expanduser("~/.cache/pip/wheels/**/llama_cpp_python-0.3.36-*.whl")
    return sorted(glob.glob(pattern, recursive=True))[:1]


def image_context(work: Path) -> Path:
    """The project's build context: what the Dockerfile copies, and the host's wheel."""
    context = work / "context"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    for package in ("server", "engine", "cache", "chat"):
        shutil.copytree(ROOT / package, context / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (context / ".wheels").mkdir()
    for wheel in host_wheels():
        shutil.copy(wheel, context / ".wheels")
    return context


def inputs_digest(docker: Docker, *contexts: Path) -> str:
    """sha256 over what the test image is built from: the debootstrapped image's id (none
    yet: a digest no image carries) and every file of the build contexts, name and bytes."""
    digest = hashlib.sha256()
    found = docker.run("image", "inspect", "-f", "{{.Id}}", DEBOOTSTRAP_IMAGE, check=False)
    digest.update(found.stdout.strip().encode() if found.returncode == 0 else b"none")
    for context in contexts:
        for path in sorted(p for p in context.rglob("*") if p.is_file()):
            digest.update(f"\0{context.name}/{path.relative_to(context)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def image_digest(docker: Docker) -> str | None:
    """The digest label of the test image there is, or None (no image, or no label)."""
    template = "{{index .Config.Labels \"" + DIGEST_LABEL + "\"}}"
    found = docker.run("image", "inspect", "-f", template, IMAGE, check=False)
    label = found.stdout.strip()
    return label if found.returncode == 0 and label and label != "<no value>" else None


def build_image(docker: Docker, context: Path, digest: str) -> float:
    """Build the project's Dockerfile as it is (base image: the test base), labelled with
    its inputs' digest (the label is the build's, not the Dockerfile's); seconds."""
    start = time.monotonic()
    result = docker.run(
        "build", "--network", "host", "--progress", "plain",
        "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--label", f"{DIGEST_LABEL}={digest}",
        "-t", IMAGE, str(context), timeout=2400, check=False,
    )
    (context.parent / "build.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return time.monotonic() - start
