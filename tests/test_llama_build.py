"""bench/llama_build.py's bookkeeping, without building anything: what counts as built,
which llama.cpp commit a version vendors, and a machine that cannot build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import llama_build
from bench.llama_build import Build


def tree(tmp_path: Path, version: str = "0.3.36") -> Build:
    build = Build(version, llama_build.FLAGS, tmp_path / f"{version}-abc")
    build.binary("llama-server").parent.mkdir(parents=True)
    return build


def finish(build: Build, target: str, content: bytes = b"\x7fELF") -> None:
    """What ensure() leaves after a successful build: the binary, then its marker."""
    build.binary(target).write_bytes(content)
    record = {"binary": llama_build._binary_id(build.binary(target)), "build_s": 1.0}
    build.marker(target).write_text(json.dumps(record))


def test_a_binary_without_its_marker_is_not_built(tmp_path: Path) -> None:
    build = tree(tmp_path)
    build.binary("llama-server").write_bytes(b"half-linked")  # a build killed mid-link
    assert not llama_build.is_built(build, "llama-server")
    finish(build, "llama-server")
    assert llama_build.is_built(build, "llama-server")
    assert not llama_build.is_built(build, "test-llama-archs")


def test_a_binary_changed_after_its_marker_is_not_built(tmp_path: Path) -> None:
    build = tree(tmp_path)
    finish(build, "llama-server")
    build.binary("llama-server").write_bytes(b"\x7fELF rebuilt by hand, or truncated")
    assert not llama_build.is_built(build, "llama-server")
    build.marker("llama-server").write_text("{not json")
    assert not llama_build.is_built(build, "llama-server")


def test_the_vendored_commit_is_read_from_this_versions_changelog_entry(tmp_path: Path) -> None:
    build = tree(tmp_path, "0.3.35")
    (build.root / "src").mkdir()
    (build.root / "src" / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [Unreleased]\n\n## [0.3.36]\n\n"
        "- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n\n"
        "## [0.3.35]\n\n- fix: something\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n\n"
        "## [0.3.34]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@e3546c794\n"
    )
    assert llama_build.llama_commit(build) == "4df29be4f"
    assert llama_build.llama_commit(Build("0.3.33", (), build.root)) == "unknown"


def test_no_toolchain_is_unavailable_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(llama_build.BuildUnavailable, match="cmake, C\\+\\+ compiler, make"):
        llama_build.build_for("0.3.36")


def test_unknown_targets_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="unknown target 'llama-cli'"):
        llama_build.ensure("llama-cli")
