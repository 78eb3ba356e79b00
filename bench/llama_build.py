"""Build llama.cpp's own binaries from the sources llama-cpp-python was made from.

    python bench/llama_build.py                       # llama-server and test-llama-archs
    python bench/llama_build.py --target llama-server

The benchmarks' peer (`llama-server`) and the tests' model writer (`test-llama-archs`)
must be the llama.cpp that kvserve runs on, or a ratio compares two versions. So the
sources are the ones vendored in the sdist of the *installed* llama-cpp-python version,
fetched with pip (its cache makes the second fetch quick), configured with the fixed
FLAGS below and built one target at a time. Everything lives under
`~/.cache/kvserve/llama-build/<version>-<hash>/` (KVSERVE_LLAMA_BUILD_DIR overrides the
root): outside the repository, so a fresh clone on the same machine reuses it. The hash
covers FLAGS, the compiler and the CPU (GGML_NATIVE is on: a binary built for one CPU may
not run on another). A lock file keeps two processes from building at once, and a
target counts as built only once its marker, written after a successful build, matches
the binary on disk.

Importable: `binary("llama-server")` returns the path, building it first if needed;
`BuildUnavailable` says that this machine cannot build at all (no cmake or no C++
compiler), as opposed to a build that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TARGETS = ("llama-server", "test-llama-archs")

# What the vendored CMakeLists (llama-cpp-python 0.3.36) needs so that nothing is
# downloaded at build time and nothing depends on what else the machine has installed:
# - LLAMA_CURL is gone from this tree (only a deprecation warning), so it is not passed;
# - LLAMA_OPENSSL=OFF: otherwise cpp-httplib links whatever OpenSSL it finds;
# - LLAMA_USE_PREBUILT_UI=OFF: on by default, it downloads the server's web UI from a
#   Hugging Face bucket while building llama-server (LLAMA_BUILD_UI, npm, is off already);
# - no examples and no unified app: only the targets asked for are built anyway, this
#   keeps the configure step short.
FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


# A CUDA build (bench/gpu_check.sh): the same flags plus GGML_CUDA, for one GPU
# architecture (compute capability without the dot, "90" for Hopper): every
# architecture's kernels would take most of a device check's 10 minutes to compile.
# Its own cache tree, since the hash covers the flags.
CUDA_ENV = "KVSERVE_LLAMA_CUDA"  # the architecture; unset: the CPU build


# Its CPU code is built for any x86-64 with AVX2 rather than for the building CPU
# (GGML_NATIVE off): a CUDA build may be made on one machine (nvcc needs no GPU) and run on
# the device machine, whose CPU differs; with every layer on the GPU the CPU code matters
# little.
PORTABLE_CPU = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
                "-DGGML_F16C=ON", "-DGGML_BMI2=ON")  # fmt: skip


def flags_for(cuda_arch: str | None) -> tuple[str, ...]:
    if not cuda_arch:
        return FLAGS
    return (*FLAGS, *PORTABLE_CPU, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}")


def configured_flags() -> tuple[str, ...]:
    """FLAGS, or the CUDA flags when $KVSERVE_LLAMA_CUDA names an architecture."""
    return flags_for(os.environ.get(CUDA_ENV) or None)


class BuildUnavailable(RuntimeError):
    """This machine has no cmake or no C++ compiler: nothing can be built here."""


class BuildFailed(RuntimeError):
    """A step of the build failed; the message carries the command and its output's tail."""


@dataclass(frozen=True)
class Build:
    """One cached build tree: llama-cpp-python `version`, built with `flags`."""

    version: str
    flags: tuple[str, ...]
    root: Path

    @property
    def source(self) -> Path:
        return self.root / "src" / "vendor" / "llama.cpp"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    def binary(self, target: str) -> Path:
        return self.build_dir / "bin" / target

    def marker(self, target: str) -> Path:
        return self.root / f"{target}.built.json"


def installed_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def cache_root() -> Path:
    """~/.cache/kvserve/llama-build, not under $XDG_CACHE_HOME: the test suite points that at
    a temporary directory, and a build of several minutes must outlive a test session."""
    env = os.environ.get("KVSERVE_LLAMA_BUILD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvserve" / "llama-build"


def _toolchain() -> tuple[str, str]:
    """(cmake, c++ compiler) paths, or BuildUnavailable."""
    cmake = shutil.which("cmake")
    cxx = shutil.which(os.environ.get("CXX", "")) or shutil.which("c++") or shutil.which("g++")
    builder = shutil.which("make") or shutil.which("ninja")  # the CUDA image has ninja only
    tools = (("cmake", cmake), ("C++ compiler", cxx), ("make or ninja", builder))
    missing = [name for name, path in tools if not path]
    if missing:
        raise BuildUnavailable(
            f"cannot build llama.cpp here: {', '.join(missing)} not found on PATH "
            "(Debian: apt-get install cmake g++ make)"
        )
    return str(cmake), str(cxx)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return os.uname().machine


def _compiler_id(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def build_for(version: str | None = None, flags: tuple[str, ...] = FLAGS) -> Build:
    """The cache location of the build of `version` (default: the installed one)."""
    version = version or installed_version()
    _cmake, cxx = _toolchain()
    key = json.dumps([list(flags), _compiler_id(cxx), _cpu_model()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Build(version, flags, cache_root() / f"{version}-{digest}")


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the folder's lock (a build tree, the family models' folder): a second process
    waits here until the first is done."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(build: Build, cmd: list[str]) -> None:
    """Run one step, its output appended to the tree's build.log (tail -f it to watch)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    log_path = build.root / "build.log"
    with open(log_path, "a") as log:
        log.write(f"\n+ {' '.join(cmd)}\n")
        log.flush()
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise BuildFailed(f"{' '.join(cmd)} exited with {code} (log: {log_path}):\n{tail}")


SDIST_ENV = "KVSERVE_LLAMA_SDIST"  # a local sdist archive: no download (an offline machine)


def _sdist(build: Build) -> Path:
    """The sdist archive, fetched once per version (pip prepares its metadata: ~1 min),
    or $KVSERVE_LLAMA_SDIST's."""
    given = os.environ.get(SDIST_ENV)
    if given:
        if f"-{build.version}." not in Path(given).name:
            raise BuildFailed(f"{SDIST_ENV}={given} is not the sdist of {build.version}")
        return Path(given)
    found = sorted((build.root / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if found:
        return found[0]
    tmp = build.root / "sdist.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _run(build, [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
          ":all:", f"llama-cpp-python=={build.version}", "-d", str(tmp)])  # fmt: skip
    archives = sorted(tmp.glob("llama_cpp_python-*.tar.gz"))
    if len(archives) != 1:
        raise BuildFailed(f"pip download left {archives} in {tmp}, not one sdist")
    tmp.rename(build.root / "sdist")  # a finished download only: the rename is the mark
    return build.root / "sdist" / archives[0].name


def _unpack(build: Build) -> None:
    if (build.root / "src").is_dir():
        return
    tmp = build.root / "src.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with tarfile.open(_sdist(build)) as tar:
        tar.extractall(tmp, filter="data")
    (top,) = tmp.iterdir()  # llama_cpp_python-VERSION/
    top.rename(build.root / "src")
    tmp.rmdir()
    # 74 MB that nothing reads once src/ is there (none at all when $KVSERVE_LLAMA_SDIST gave it)
    shutil.rmtree(build.root / "sdist", ignore_errors=True)


def llama_commit(build: Build) -> str:
    """The llama.cpp commit this version vendors, from its CHANGELOG ("update llama.cpp to
    ggml-org/llama.cpp@HASH" under the version's heading); "unknown" when it says none.
    The sdist has no git metadata, so without this `--version` would say "unknown"."""
    text = (build.root / "src" / "CHANGELOG.md").read_text(errors="replace")
    section = text.split(f"## [{build.version}]", 1)[-1].split("\n## [", 1)[0]
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
    return found.group(1) if found else "unknown"


def _configure(build: Build) -> None:
    stamp = build.root / "configured.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == list(build.flags):
        return
    cmake, cxx = _toolchain()
    commit = llama_commit(build)
    where = ["-S", str(build.source), "-B", str(build.build_dir)]
    fixed = [f"-DCMAKE_CXX_COMPILER={cxx}", f"-DLLAMA_BUILD_COMMIT={commit}"]
    if not shutil.which("make"):
        fixed += ["-G", "Ninja"]
    _run(build, [cmake, *where, *fixed, *build.flags])
    stamp.write_text(json.dumps(list(build.flags)))


def _binary_id(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def is_built(build: Build, target: str) -> bool:
    """Built and finished: the marker written after the build names this very binary."""
    marker, path = build.marker(target), build.binary(target)
    if not (marker.is_file() and path.is_file()):
        return False
    with contextlib.suppress(ValueError, KeyError):
        return bool(json.loads(marker.read_text())["binary"] == _binary_id(path))
    return False


def ensure(target: str, *, jobs: int = 2, build: Build | None = None) -> Path:
    """The path of `target`'s binary, building it (and fetching the sources) if needed."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    build = build or build_for()
    if is_built(build, target):
        return build.binary(target)
    with locked(build.root):
        if is_built(build, target):  # another process built it while we waited
            return build.binary(target)
        build.marker(target).unlink(missing_ok=True)
        started, load = time.monotonic(), os.getloadavg()[0]
        _unpack(build)
        _configure(build)
        cmake, _cxx = _toolchain()
        _run(build, [cmake, "--build", str(build.build_dir), "--target", target, "-j", str(jobs)])
        seconds = round(time.monotonic() - started, 1)
        # the machine may be shared: the load says how much of the CPU the build had
        record = {"binary": _binary_id(build.binary(target)), "build_s": seconds, "jobs": jobs,
                  "load_1m": [round(load, 1), round(os.getloadavg()[0], 1)]}  # fmt: skip
        build.marker(target).write_text(json.dumps(record))
        print(f"built {target} in {seconds} s", file=sys.stderr, flush=True)
    return build.binary(target)


def binary(target: str) -> Path:
    return ensure(target)


def version_of(path: Path) -> str:
    """What `llama-server --version` says (version and commit, compiler and target)."""
    proc = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                          check=False, timeout=30)  # fmt: skip
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return "; ".join(line for line in lines if line.startswith(("version", "built")))


def describe(build: Build, path: Path) -> str:
    """Lines that say which binary it is: path, llama.cpp version, flags."""
    # a build made for another machine may not start here (no CUDA libraries): no version
    about = version_of(path) if path.name == "llama-server" else ""
    version = f"; {about}" if about else ""
    return (
        f"{path.name}: {path}\n"
        f"  llama-cpp-python {build.version}'s llama.cpp {llama_commit(build)}{version}\n"
        f"  flags: {' '.join(build.flags)}"
    )


@dataclass(frozen=True)
class Peer:
    path: Path
    description: str  # which binary, which llama.cpp, which flags (for every printed figure)


@functools.cache
def peer_server() -> Peer:
    """The benchmarks' llama-server: $LLAMA_SERVER when set, else this module's build."""
    given = os.environ.get("LLAMA_SERVER")
    if given:
        packed = Path(given).parent / "BUILD.txt"  # written by pack(): the build it came from
        if packed.is_file():
            return Peer(Path(given), f"(from LLAMA_SERVER, packed) {packed.read_text().strip()}")
        about = version_of(Path(given)) or "no --version output"
        return Peer(Path(given), f"llama-server: {given} (from LLAMA_SERVER; flags unknown)\n"
                                 f"  {about}")  # fmt: skip
    build = build_for(flags=configured_flags())
    path = ensure("llama-server", build=build)
    return Peer(path, describe(build, path))


def pack(build: Build, target: str, dest: Path) -> None:
    """Copy `target` and the shared libraries beside it (libllama, libggml*, libmtmd) to
    `dest`, with BUILD.txt saying which build they are: a build made here to run on another
    machine (gpu_check.sh --prebuilt). Their run path names this build tree, so the other
    machine finds the libraries through LD_LIBRARY_PATH."""
    dest.mkdir(parents=True, exist_ok=True)
    binary = build.binary(target)
    for path in [binary, *sorted(binary.parent.glob("*.so*"))]:
        shutil.copy2(path, dest / path.name, follow_symlinks=False)  # the .so links stay links
    (dest / "BUILD.txt").write_text(describe(build, binary) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", action="append", choices=TARGETS, help="default: all")
    p.add_argument("--jobs", "-j", type=int, default=2)
    p.add_argument("--cuda", metavar="ARCH", default=os.environ.get(CUDA_ENV),
                   help=f"a CUDA build for this GPU architecture, e.g. 90 (${CUDA_ENV})",
                   )  # fmt: skip
    p.add_argument("--version", help="of llama-cpp-python's sources (default: the installed one)")
    p.add_argument(
        "--pack",
        metavar="DIR",
        type=Path,
        help="copy the targets and their libraries to DIR, to run elsewhere",
    )
    args = p.parse_args(argv)
    build = build_for(args.version, flags=flags_for(args.cuda))
    for target in args.target or TARGETS:
        path = ensure(target, jobs=args.jobs, build=build)
        print(describe(build, path))
        if args.pack:
            pack(build, target, args.pack)


if __name__ == "__main__":
    main()
