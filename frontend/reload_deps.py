"""Which files under a Python function's `codePath` its code is made of, for `serve --reload`.

Functions usually share one `functions/` directory; redeploying every one of them when any file
there changes restarts workers and drops sessions for nothing. This follows the handler's (and
initializer's, preStop's) module and, from its source (ast, nothing imported), every module it
imports that resolves inside the `codePath`, transitively. A package imported is taken whole (its
submodules are often imported by name at run time). Imports built at run time
(`importlib.import_module(name)`) are not seen: such a helper's edit reaches the function on its
next redeploy, or with a touch of the handler file.
"""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from runtime.manifest import FunctionSpec

__all__ = ("code_files", "forget_modules")


def _module_target(code_path: Path, dotted: str) -> list[Path]:
    """The files `import dotted` runs from `code_path`: each package's `__init__.py` on the way and
    the module file, or every `.py` of the package it names."""
    parts = dotted.split(".")
    found: list[Path] = []
    for i in range(1, len(parts) + 1):
        base = code_path.joinpath(*parts[:i])
        if i == len(parts):
            if base.with_suffix(".py").is_file():
                found.append(base.with_suffix(".py"))
            elif (base / "__init__.py").is_file() or base.is_dir():
                found.extend(_package_files(base))
        elif (base / "__init__.py").is_file():
            found.append(base / "__init__.py")
        elif not base.is_dir():
            return found
    return found


def _package_files(directory: Path) -> list[Path]:
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        files.extend(Path(dirpath) / n for n in filenames if n.endswith(".py"))
    return files


def _imports(path: Path, code_path: Path) -> list[Path]:
    """The files under `code_path` that `path`'s import statements name."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # the file itself still counts; its deploy reports the error
    found: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.extend(_module_target(code_path, alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importing file's package
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                if not base.is_relative_to(code_path):
                    continue
                root, prefix = base, node.module or ""
            else:
                root, prefix = code_path, node.module or ""
            if prefix:
                found.extend(_module_target(root, prefix))
            for alias in node.names:  # `from pkg import submodule`
                dotted = f"{prefix}.{alias.name}" if prefix else alias.name
                target = root.joinpath(*dotted.split("."))
                if target.with_suffix(".py").is_file() or target.is_dir():
                    found.extend(_module_target(root, dotted))
    return found


def code_files(spec: FunctionSpec) -> set[Path] | None:
    """The `.py` files the function is made of, or None when that is not followed (Java: the
    whole `codePath` counts). Runs in a worker thread (file reads)."""
    if spec.is_java:
        return None
    code_path = spec.codePath
    todo: list[Path] = []
    for ref in (spec.handler, spec.initializer, spec.preStop):
        if ref:
            module = ref.rpartition(".")[0] if "." in ref else ref
            missing = code_path.joinpath(*module.split(".")).with_suffix(".py")  # counts once created
            todo.extend(_module_target(code_path, module) or [missing])
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(p for p in _imports(path, code_path) if p not in seen)
    return seen


def forget_modules(files: set[Path]) -> None:
    """Drop the imported helper modules loaded from `files`, so the redeploy imports them again
    (a handler's `import helper` would otherwise get the cached module and the old code)."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file) in files:
            del sys.modules[name]
