"""The suite's own warning filters (pyproject.toml) make a leaked socket, file or event
loop fail the test that leaked it, and a module's scoped ignore covers that module only.
A server process the tests start reports its leaks in its log, which fails the test.

Each pytest case is a small test file run by pytest in a subprocess under the project's
configuration (`-c pyproject.toml`), as the suite runs: a filter that ignored such leaks
suite-wide would let the leaking tests pass here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kvserve_process import SHOW_LEAKS, Server, assert_no_leaks

ROOT = Path(__file__).resolve().parent.parent

LEAKY = '''
import asyncio
import gc
import socket


def test_leaks_a_socket():
    socket.socket()  # never closed: freed at once, unclosed


def test_leaks_a_file(tmp_path):
    open(tmp_path / "f", "wb")  # never closed


def test_leaks_an_event_loop():
    asyncio.new_event_loop()  # never closed
    gc.collect()  # an event loop is kept by a reference cycle


def test_closes_what_it_opens(tmp_path):
    with socket.socket(), open(tmp_path / "f", "wb"):
        pass
'''

# The pattern a module uses when a third-party library it tests leaks: its own ignore,
# and its garbage collected before its tests end.
SCOPED = '''
import socket

import pytest

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


def test_leaks_a_socket_where_it_is_allowed():
    socket.socket()
'''

NEIGHBOUR = '''
import socket


def test_leaks_a_socket_next_to_a_module_that_may():
    socket.socket()
'''


def run_pytest(tmp_path: Path, files: dict[str, str]) -> dict[str, str]:
    """Outcome per test id ("test_leaky.py::test_leaks_a_socket": "FAILED", ...)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-rA", "-q", *files],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    outcomes = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            outcomes[rest.split(" ")[0]] = word
    assert outcomes, proc.stdout + proc.stderr
    return outcomes | {"output": proc.stdout}


def test_a_leaked_socket_file_or_event_loop_fails_its_test(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, {"test_leaky.py": LEAKY})
    output = result.pop("output")
    assert result == {
        "test_leaky.py::test_leaks_a_socket": "FAILED",
        "test_leaky.py::test_leaks_a_file": "FAILED",
        "test_leaky.py::test_leaks_an_event_loop": "FAILED",
        "test_leaky.py::test_closes_what_it_opens": "PASSED",
    }, output
    assert "ResourceWarning: unclosed <socket.socket" in output
    assert "ResourceWarning: unclosed file" in output
    # (the event loop's own warning comes in a group with its self-pipe's sockets, which
    # pytest's report may show alone)


def test_a_scoped_ignore_covers_its_own_module_only(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, {"test_scoped.py": SCOPED, "test_neighbour.py": NEIGHBOUR})
    output = result.pop("output")
    assert result == {
        "test_scoped.py::test_leaks_a_socket_where_it_is_allowed": "PASSED",
        "test_neighbour.py::test_leaks_a_socket_next_to_a_module_that_may": "FAILED",
    }, output


def test_a_server_process_that_leaks_fails_the_test(tmp_path: Path) -> None:
    """The environment tests/kvserve_process.py gives a server, on a process that imports
    llama_cpp (whose /dev/null files are let be) and leaks a socket: the warning is in its
    log, and the check made when the server stops fails."""
    log_path = tmp_path / "kvserve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", "import llama_cpp, socket; socket.socket(); print('served')"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **SHOW_LEAKS},
        )  # fmt: skip
    assert process.wait(60) == 0
    with pytest.raises(AssertionError, match="ResourceWarning: unclosed <socket.socket"):
        assert_no_leaks(Server("http://unused", process, log_path))
    assert "/dev/null" not in log_path.read_text()
