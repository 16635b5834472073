"""Loading handler code from a function's codePath, inside the configured code roots.

Each deployment imports its modules under fresh names, so a redeploy gets new code while
invocations in flight keep the module objects they started with.
"""
from __future__ import annotations

import importlib.util
import itertools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from .errors import DeployError
from .jobs.handler_style import adapt_handler
from .manifest import FunctionSpec
from .runpod_compat import RunpodOptions, capture_start
from .runpod_compat import install as install_runpod_shim
from .yr_compat import install as install_yr_shim

install_yr_shim()  # [jobs hook] openYuanrong handler code may `import yr` (no real yr installed)
install_runpod_shim()  # RunPod worker files call runpod.serverless.start() when imported

__all__ = ("LoadedCode", "load_code", "check_code_root", "check_code_location")

_counter = itertools.count(1)


class LoadedCode:
    """The callables of one deployment."""

    __slots__ = ("handler", "initializer", "pre_stop", "runpod")

    def __init__(self, handler: Callable[..., Any], initializer: Callable[..., Any] | None,
                 pre_stop: Callable[..., Any] | None, runpod: RunpodOptions | None = None) -> None:
        self.handler = handler
        self.initializer = initializer
        self.pre_stop = pre_stop
        self.runpod = runpod  # the handler module's runpod.serverless.start() options


def check_code_root(code_path: Path, code_roots: list[Path], name: str) -> None:
    if not code_roots:
        return
    resolved = code_path.resolve()
    if not any(resolved == root or root in resolved.parents for root in code_roots):
        roots = ", ".join(str(r) for r in code_roots)
        raise DeployError(f"function {name!r}: codePath {resolved} is outside the allowed code roots ({roots}); "
                          f"widen runtime.codeRoots to allow it: add the directory to runtime.codeRoots in the "
                          f"config file, or start with -s 'runtime.codeRoots=[{roots}, {resolved}]' (a list; [] "
                          "allows any directory)")


def _module_file(code_path: Path, module: str) -> Path:
    base = code_path.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no module {module!r} in {code_path}")


def _import(spec: FunctionSpec, module: str) -> tuple[ModuleType, RunpodOptions | None]:
    path = _module_file(spec.codePath, module)
    unique = f"_fnstream_{spec.name.replace('-', '_')}_{next(_counter)}_{module.replace('.', '_')}"
    mod_spec = importlib.util.spec_from_file_location(unique, path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    # Handlers may import helper modules that sit beside them.
    code_dir = str(spec.codePath)
    if code_dir not in sys.path:
        sys.path.append(code_dir)
    sys.modules[unique] = mod
    try:
        with capture_start() as starts:
            mod_spec.loader.exec_module(mod)
        options = RunpodOptions.from_config(starts[-1], f"module {module!r}") if starts else None
    except BaseException:
        del sys.modules[unique]
        raise
    return mod, options


def _where(exc: BaseException, code_path: Path) -> str:
    """` at FILE:LINE` of a failed import: the syntax error's own position, else the deepest frame
    in the function's code (not importlib's), else the deepest frame."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if Path(f.filename).is_relative_to(code_path)]
    last = (own or frames)[-1:]
    return f" at {last[0].filename}:{last[0].lineno}" if last else ""


_OWN_PACKAGES = {"runtime": Path(__file__).resolve().parent,
                 "frontend": Path(__file__).resolve().parent.parent / "frontend"}


def check_not_shadowed(code_path: Path, name: str) -> None:
    """DeployError if the code holds its own `runtime` or `frontend` module: fnstream's packages of
    those names come first on sys.path, so the handler's `import runtime` would get fnstream's."""
    for module, own in _OWN_PACKAGES.items():
        for candidate in (code_path / module, code_path / f"{module}.py"):
            if candidate.exists() and candidate.resolve() != own:
                raise DeployError(f"function {name!r}: {candidate} is shadowed by fnstream's own {module!r} "
                                  f"package ({own}); rename the module")


def check_code_location(spec: FunctionSpec, code_roots: list[Path]) -> None:
    """DeployError unless `spec.codePath` is a directory inside the code roots (nothing imported)."""
    check_code_root(spec.codePath, code_roots, spec.name)
    if not spec.codePath.is_dir():
        raise DeployError(f"function {spec.name!r}: codePath {spec.codePath} is not a directory")
    check_not_shadowed(spec.codePath, spec.name)


def load_code(spec: FunctionSpec, code_roots: list[Path]) -> LoadedCode:
    """Import the handler (and initializer/preStop) of `spec`; DeployError says what failed."""
    check_code_location(spec, code_roots)
    modules: dict[str, tuple[ModuleType, RunpodOptions | None]] = {}

    def resolve(field: str, ref: str | None) -> Callable[..., Any] | None:
        if ref is None:
            return None
        module, _, attr = ref.rpartition(".") if "." in ref else (ref, "", "")
        try:
            if module not in modules:
                modules[module] = _import(spec, module)
        except FileNotFoundError as exc:
            raise DeployError(f"function {spec.name!r}: {field} {ref!r}: {exc}") from None
        except BaseException as exc:
            where = _where(exc, spec.codePath)
            raise DeployError(f"function {spec.name!r}: importing {module!r} failed: "
                              f"{type(exc).__name__}: {exc}{where}") from None
        mod, options = modules[module]
        if not attr:  # `handler: MODULE`: the handler its runpod.serverless.start() call names
            if options is None:
                raise DeployError(f"function {spec.name!r}: {field} {ref!r}: module {module!r} does not call "
                                  "runpod.serverless.start(); name the function as 'module.function'")
            return options.handler
        func = getattr(mod, attr, None)
        if not callable(func):
            raise DeployError(f"function {spec.name!r}: {field} {ref!r}: module {module!r} has no callable {attr!r}")
        return cast("Callable[..., Any]", func)

    handler = resolve("handler", spec.handler)
    assert handler is not None
    module = spec.handler.rpartition(".")[0] if "." in spec.handler else spec.handler
    options = modules[module][1] if module in modules else None
    handler = adapt_handler(handler)  # [jobs hook] `def handler(job)`: RunPod-style, one parameter
    return LoadedCode(handler, resolve("initializer", spec.initializer), resolve("preStop", spec.preStop), options)
