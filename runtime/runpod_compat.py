"""RunPod worker files deploy unchanged: `runpod.serverless.start(config)` at the bottom of a module.

On RunPod that call starts the worker loop (signals, polling RunPod's job queue); here, while
fnstream imports handler code, it only records `config` (the handler and its options), and the
deployment runs the handler as RunPod would. With no `runpod` package installed a small `runpod`
module stands in (start, progress_update, RunPodLogger); with the real one, `runpod.serverless` is
wrapped as it is imported, so nothing is imported before handler code asks for it.
`progress_update(job, data)` of a fnstream job goes to the job (`/v2/{fn}/status/{id}` shows
it while the job runs); of any other job, to the real SDK.
"""
from __future__ import annotations

import contextvars
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ("RunpodOptions", "capture_start", "install", "report_progress", "set_progress_sink")

log = logging.getLogger("fnstream.runtime")

_capture: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "fnstream_runpod_start", default=None)
# Where progress_update of a fnstream job goes: (job id, data) -> True if the job is one of ours.
_progress_sinks: list[Callable[[str, Any], bool]] = []


@dataclass(frozen=True, slots=True)
class RunpodOptions:
    """What a module's `runpod.serverless.start(config)` asked for."""

    handler: Callable[..., Any]
    concurrency: int | None    # concurrency_modifier(1): the jobs one instance takes at once
    aggregate_stream: bool     # return_aggregate_stream: /run and /runsync output = the yielded items
    refresh_worker: bool       # the instance is recycled after each job

    @classmethod
    def from_config(cls, config: Any, where: str) -> RunpodOptions:
        if not isinstance(config, dict) or not callable(config.get("handler")):
            raise ValueError(f"{where}: runpod.serverless.start() needs a config dict with a callable 'handler'")
        modifier = config.get("concurrency_modifier")
        concurrency = None
        if modifier is not None:
            value = modifier(1)  # RunPod starts at 1 and asks the modifier for the next value
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: concurrency_modifier(1) must return a positive integer (got {value!r})")
            concurrency = value
        return cls(config["handler"], concurrency, bool(config.get("return_aggregate_stream", False)),
                   bool(config.get("refresh_worker", False)))


def _start(config: Any, original: Callable[[Any], Any] | None = None) -> None:
    calls = _capture.get()
    if calls is not None:
        calls.append(config)
        return
    if original is not None:  # not while fnstream imports handler code: the real worker loop
        original(config)
        return
    raise RuntimeError("runpod.serverless.start(): this `runpod` is fnstream's stand-in; deploy the module "
                       "with fnstream (or install the runpod package to run it as a RunPod worker)")


def _progress(job: Any, progress: Any, original: Callable[[Any, Any], Any] | None = None) -> None:
    job_id = job.get("id") if isinstance(job, dict) else None
    if isinstance(job_id, str) and report_progress(job_id, progress):
        return
    if original is not None:
        original(job, progress)
    else:
        log.debug("runpod.serverless.progress_update for job %r, which is not a fnstream job here", job_id)


def report_progress(job_id: str, progress: Any) -> bool:
    """A progress update of a job from elsewhere (a worker process): to the sinks; True if one took it."""
    return any(sink(job_id, progress) for sink in list(_progress_sinks))


def set_progress_sink(sink: Callable[[str, Any], bool], *, remove: bool = False) -> None:
    """[jobs hook] A job manager takes progress updates of its own jobs (any thread may call them)."""
    if remove:
        if sink in _progress_sinks:
            _progress_sinks.remove(sink)
    else:
        _progress_sinks.append(sink)


@contextmanager
def capture_start() -> Iterator[list[dict[str, Any]]]:
    """While the block runs (an import of handler code), start(config) calls are recorded here."""
    calls: list[dict[str, Any]] = []
    token = _capture.set(calls)
    try:
        yield calls
    finally:
        _capture.reset(token)


def _patch(serverless: types.ModuleType) -> None:
    if getattr(serverless, "_fnstream_patched", False):
        return
    real_start, real_progress = serverless.start, serverless.progress_update

    def start(config: Any) -> None:
        _start(config, real_start)

    def progress_update(job: Any, progress: Any) -> None:
        _progress(job, progress, real_progress)

    serverless.start = start  # type: ignore[attr-defined]
    serverless.progress_update = progress_update  # type: ignore[attr-defined]
    serverless._fnstream_patched = True  # type: ignore[attr-defined]


class _PatchingLoader(importlib.abc.Loader):
    """The real `runpod.serverless` loader, then the patch."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        _patch(module)


class _RunpodFinder(importlib.abc.MetaPathFinder):
    """Finds the real `runpod.serverless` and wraps its loader (nothing else is touched)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "runpod.serverless":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _Logger:
    """RunPodLogger's methods, on the `fnstream.handler` logger."""

    def __init__(self) -> None:
        self._log = logging.getLogger("fnstream.handler")

    def _at(self, level: int, message: Any, request_id: str | None = None) -> None:
        self._log.log(level, "%s%s", f"{request_id} | " if request_id else "", message)

    def debug(self, message: Any, request_id: str | None = None) -> None:
        self._at(logging.DEBUG, message, request_id)

    def info(self, message: Any, request_id: str | None = None) -> None:
        self._at(logging.INFO, message, request_id)

    def warn(self, message: Any, request_id: str | None = None) -> None:
        self._at(logging.WARNING, message, request_id)

    warning = warn

    def error(self, message: Any, request_id: str | None = None) -> None:
        self._at(logging.ERROR, message, request_id)


def _stand_in() -> None:
    runpod = types.ModuleType("runpod", "fnstream's stand-in for the runpod SDK (worker side only)")
    serverless = types.ModuleType("runpod.serverless")
    serverless.start = _start  # type: ignore[attr-defined]
    serverless.progress_update = _progress  # type: ignore[attr-defined]
    serverless._fnstream_patched = True  # type: ignore[attr-defined]
    runpod.serverless = serverless  # type: ignore[attr-defined]
    runpod.RunPodLogger = _Logger  # type: ignore[attr-defined]
    runpod.__path__ = []  # a package: `import runpod.serverless` works
    sys.modules["runpod"] = runpod
    sys.modules["runpod.serverless"] = serverless


_installed: list[bool] = []


def install() -> bool:
    """Make `runpod.serverless.start` record instead of start; True when the stand-in is used."""
    if _installed:
        return _installed[0]
    if "runpod.serverless" in sys.modules:
        _patch(sys.modules["runpod.serverless"])
        _installed.append(False)
    elif importlib.util.find_spec("runpod") is None:
        _stand_in()
        _installed.append(True)
    else:
        sys.meta_path.insert(0, _RunpodFinder())
        _installed.append(False)
    return _installed[0]
