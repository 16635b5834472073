"""Every module of runtime/ and frontend/ imports on its own, in a fresh interpreter (as aiohttp's
test_circular_imports.py), and the import graph keeps its direction: runtime/ never imports
frontend/, only cluster modules import redis, the process worker's program loads neither the
registry nor its own supervisor, and no module (counting type-only imports) imports itself back.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "frontend")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _loaded_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"import {module} failed on its own:\n{proc.stderr}"
    return set(json.loads(proc.stdout))


def test_the_module_list_is_complete() -> None:
    assert {"runtime.deployment", "runtime.dispatch", "runtime.process.worker", "frontend.app"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module: str) -> None:
    loaded = _loaded_after_import(module)
    if module.startswith("runtime"):
        assert not {m for m in loaded if m == "frontend" or m.startswith("frontend.")}, \
            f"{module} imports the HTTP frontend"
    if not (module.startswith("runtime.cluster") or module == "frontend.cluster"):
        assert "redis" not in loaded, f"{module} imports redis without cluster mode"


def test_worker_process_loads_neither_registry_nor_its_supervisor() -> None:
    loaded = _loaded_after_import("runtime.process.worker")
    for upper in ("runtime.registry", "runtime.process.pool", "runtime.process.executor", "runtime.executor",
                  "runtime.dispatch", "aiohttp"):
        assert upper not in loaded, f"the worker process imports {upper}"


def test_handler_api_is_only_the_handler_api() -> None:
    import runtime

    exported = set(runtime.__all__)
    assert {"Context", "create_stream_producer", "ProducerConfig", "SubscriptionConfig", "HandlerError"} <= exported
    assert not exported & {"Registry", "Executor", "Invocation", "Deployment", "Config", "Dispatcher"}
    assert all(hasattr(runtime, name) for name in exported)


def _imports(path: Path, module: str) -> set[str]:
    """Every module of ours that `module` names in an import, at any depth (type-only ones too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m in MODULES and m != module}


def test_import_graph_has_no_cycles() -> None:
    """Counting imports inside functions and under TYPE_CHECKING, so the layering is real, not hidden.
    A package's own __init__ and its submodules are not a cycle (importing a submodule runs it)."""
    def source(m: str) -> Path:
        module_file = ROOT / (m.replace(".", "/") + ".py")
        return module_file if module_file.exists() else ROOT / m.replace(".", "/") / "__init__.py"

    graph = {m: {t for t in _imports(source(m), m) if not (t.startswith(m + ".") or m.startswith(t + "."))}
             for m in MODULES}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = [*path[path.index(t):], t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)


def test_the_listener_imports_no_route() -> None:
    """frontend/server.py's fast lane is handed the app's invoke (frontend/front_door.py
    `InvokeLane`): the listener and its front door load no route module of their own."""
    for module in ("frontend.server", "frontend.front_door"):
        loaded = _loaded_after_import(module)
        assert not {m for m in loaded if m.startswith("frontend.routes")}, f"{module} imports a route"
