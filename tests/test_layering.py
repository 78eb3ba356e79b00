"""The dependency direction of ARCHITECTURE.md, checked by walking imports: packages
import only downwards, the server sees the engine through one seam, the engine's two
threads meet only in its shared modules, each API the server speaks is one package under
server/api/ that no other API's package imports, no module takes part in an import
circle, and no code file grows past 400 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
# The server's one view of the engine (engine/client.py).
ENGINE_SEAM = {"engine.client"}
# The engine's two threads (docs/architecture.md, "Two threads"): engine/loop/ runs on the
# event loop, engine/thread/ on the engine thread. They share only the modules at the top
# of engine/ (commands, types, sequence, config, ... and engine/llama/), which import
# neither side; only the wiring sees both: the Engine that starts the thread and hands
# the loop side its `EngineThread`, and the server's seam.
ENGINE_WIRING = {"engine", "engine.engine", "engine.client"}
ENGINE_MAY_IMPORT = {
    "loop": {"loop", "shared"},
    "thread": {"thread", "shared"},
    "shared": {"shared"},
    "wiring": {"loop", "thread", "shared", "wiring"},
}
# The engine thread's state that the loop side must not read even through the objects it
# holds: the thread publishes what the loop needs (engine/commands.py `EngineThread`).
THREAD_STATE = {"scheduler", "slots", "pins", "running", "waiting"}
# Circles allowed (each the set of modules of one circle): none since issue 19.
KNOWN_CIRCLES: list[set[str]] = []
MAX_LINES = 400
KNOWN_LONG: set[str] = set()  # code files allowed past MAX_LINES: none since issue 19
API = ROOT / "server" / "api"
# What every API package may share: the request models several APIs read (the other
# servers' constraint fields: chat and completions both take them).
API_SHARED = {"server.api", "server.api.common", "server.api.constraints"}
# The one module outside server/api/ that imports API packages: the app, which lists
# their specs (server/http/apis.py) and mounts what each names.
API_USERS = {"server.app"}


def code_files(package: str) -> Iterator[Path]:
    yield from (ROOT / package).rglob("*.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Dotted names a file imports: `import a.b` gives a.b; `from a.b import c` gives
    a.b.c when that is a module of the project, else a.b. Relative imports resolved;
    function-local and `if TYPE_CHECKING:` imports count too (a circle for mypy is
    a tangle for the reader)."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                names.add(sub if _is_module(sub) else module)
    return names


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """The top-level packages a file imports."""
    return {name.split(".")[0] for name in imported_modules(path)}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downwards(package: str) -> None:
    for path in code_files(package):
        used = imports(path) & PROJECT
        assert used <= ALLOWED[package], (
            f"{path.relative_to(ROOT)} imports {used - ALLOWED[package]}"
        )


def test_only_the_engine_llama_package_touches_llama_cpp() -> None:
    llama = ROOT / "engine" / "llama"
    assert (llama / "__init__.py").is_file()
    for package in PROJECT:
        for path in code_files(package):
            if llama not in path.parents:
                assert "llama_cpp" not in imports(path), path


def test_pydantic_and_fastapi_stay_in_server() -> None:
    for package in ("engine", "chat", "cache"):
        for path in code_files(package):
            assert not imports(path) & {"pydantic", "fastapi", "starlette"}, path


def test_the_server_sees_the_engine_only_through_its_client_module() -> None:
    for path in code_files("server"):
        engine = {m for m in imported_modules(path) if m.split(".")[0] == "engine"}
        assert engine <= ENGINE_SEAM, (
            f"{path.relative_to(ROOT)} imports {engine - ENGINE_SEAM}: go through engine.client"
        )


def engine_side(module: str) -> str | None:
    """Which side of the engine a module is on: "loop", "thread", "shared" or "wiring"
    (None: not the engine's)."""
    parts = module.split(".")
    if parts[0] != "engine":
        return None
    if module in ENGINE_WIRING:
        return "wiring"
    if len(parts) > 1 and parts[1] in ("loop", "thread"):
        return parts[1]
    return "shared"


def test_the_engine_sides_are_found() -> None:
    assert engine_side("engine.thread.worker") == "thread"
    assert engine_side("engine.loop.submission") == "loop"
    assert engine_side("engine.commands") == "shared"
    assert engine_side("engine.llama.context") == "shared"
    assert engine_side("engine.client") == "wiring"
    assert engine_side("server.app") is None
    sides = {engine_side(module_name(p)) for p in code_files("engine")}
    assert sides == {"loop", "thread", "shared", "wiring"}


def test_the_engine_threads_meet_only_in_the_shared_modules() -> None:
    for path in code_files("engine"):
        side = engine_side(module_name(path))
        assert side is not None
        for module in imported_modules(path):
            other = engine_side(module)
            assert other is None or other in ENGINE_MAY_IMPORT[side], (
                f"{path.relative_to(ROOT)} ({side} side) imports {module} ({other} side)"
            )


def thread_state_reads(source: str) -> set[str]:
    """The attributes of THREAD_STATE a module's code reads (`x.scheduler`, `y.pins`)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in THREAD_STATE
    }


def test_the_loop_side_reads_no_engine_thread_state() -> None:
    # The check catches what the loop once did to learn a session's slot.
    assert thread_state_reads("self._worker.scheduler.slots.pins.get(key)") == {
        "scheduler", "slots", "pins"
    }
    assert not thread_state_reads("self._worker.pinned_sessions.get(key)")
    for path in (ROOT / "engine" / "loop").rglob("*.py"):
        read = thread_state_reads(path.read_text())
        assert not read, f"{path.relative_to(ROOT)} reads the engine thread's {sorted(read)}"


def import_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports."""
    graph = {}
    for package in PROJECT:
        for path in code_files(package):
            used = imported_modules(path)
            graph[module_name(path)] = {m for m in used if m.split(".")[0] in PROJECT}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules
    that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in graph:
                continue
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(map(sorted, circles(graph))) == [["a", "b", "c"], ["e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    new = [sorted(c) for c in circles(import_graph()) if not any(c <= k for k in KNOWN_CIRCLES)]
    assert not new, f"import circles: {new}"


# Imports between server/ sub-packages (a module of server/ itself, such as server.app,
# is a node of its own) that close a circle at package level, each with why it is there
# and who removes it. Every other import between them goes one way.
KNOWN_SERVER_BACK_EDGES: set[tuple[str, str]] = set()  # none since issue 48


def server_package(module: str) -> str | None:
    """The server/ sub-package a module belongs to ("server.serving.drive" -> "serving",
    "server.app" -> "app"); None outside server/ and for the package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "server" and len(parts) > 1 else None


def server_package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, used in import_graph().items():
        source = server_package(module)
        if source is None:
            continue
        targets = {server_package(m) for m in used} - {None, source}
        graph.setdefault(source, set()).update(t for t in targets if t is not None)
    return graph


def test_server_packages_are_found() -> None:
    assert server_package("server.serving.drive") == "serving"
    assert server_package("server.app") == "app"
    assert server_package("server") is None and server_package("engine.client") is None
    assert {"api", "http", "serving", "models", "mcp", "app"} <= set(server_package_graph())


def test_no_import_circle_between_server_packages() -> None:
    graph = server_package_graph()
    stale = sorted(e for e in KNOWN_SERVER_BACK_EDGES if e[1] not in graph.get(e[0], set()))
    assert not stale, f"these imports are gone: take them off KNOWN_SERVER_BACK_EDGES: {stale}"
    pruned = {a: {b for b in bs if (a, b) not in KNOWN_SERVER_BACK_EDGES} for a, bs in graph.items()}
    found = [sorted(c) for c in circles(pruned)]
    assert not found, f"import circles between server/ sub-packages: {found}"


def test_no_code_file_over_400_lines() -> None:
    for package in PROJECT:
        for path in code_files(package):
            name = path.relative_to(ROOT).as_posix()
            num_lines = len(path.read_text().splitlines())
            assert num_lines <= MAX_LINES or name in KNOWN_LONG, f"{name}: {num_lines} lines"


def api_packages() -> list[str]:
    return sorted(p.name for p in API.iterdir() if (p / "__init__.py").is_file())


def api_package_of(module: str) -> str | None:
    """The API package a module belongs to ("server.api.chat.router" -> "chat")."""
    parts = module.split(".")
    if parts[:2] != ["server", "api"] or len(parts) < 3 or module in API_SHARED:
        return None
    return parts[2]


def test_the_api_packages_are_found() -> None:
    assert api_packages() == [
        "chat", "completions", "embeddings", "kvserve", "messages", "ollama", "responses"
    ]
    assert api_package_of("server.api.ollama.chat") == "ollama"
    assert api_package_of("server.api.common") is None
    assert api_package_of("server.serving.drive") is None


@pytest.mark.parametrize("package", api_packages())
def test_an_api_package_imports_no_other_api_package(package: str) -> None:
    for path in (API / package).rglob("*.py"):
        others = {api_package_of(m) for m in imported_modules(path)} - {None, package}
        assert not others, f"{path.relative_to(ROOT)} imports the API packages {others}"


def test_only_the_app_imports_api_packages_from_outside() -> None:
    for path in code_files("server"):
        name = module_name(path)
        if api_package_of(name) is not None or name in API_USERS:
            continue
        used = sorted(m for m in imported_modules(path) if api_package_of(m) is not None)
        assert not used, f"{path.relative_to(ROOT)} imports {used}"


def test_every_router_lives_in_its_api_package() -> None:
    for path in code_files("server"):
        if "APIRouter(" in path.read_text():
            assert API in path.parents, f"{path.relative_to(ROOT)} defines a router"
