"""The dependency direction of ARCHITECTURE.md, checked by walking imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "server": {"server", "chat", "engine"},
    "engine": {"engine", "cache"},
    "chat": {"chat"},
    "cache": {"cache"},
}
PROJECT = set(ALLOWED)


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downwards(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        used = imports(path) & PROJECT
        assert used <= ALLOWED[package], (
            f"{path.relative_to(ROOT)} imports {used - ALLOWED[package]}"
        )


def test_only_engine_llama_touches_llama_cpp() -> None:
    for package in PROJECT:
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() != "engine/llama.py":
                assert "llama_cpp" not in imports(path), path


def test_pydantic_and_fastapi_stay_in_server() -> None:
    for package in ("engine", "chat", "cache"):
        for path in (ROOT / package).rglob("*.py"):
            assert not imports(path) & {"pydantic", "fastapi", "starlette"}, path
