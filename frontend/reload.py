"""`fnstream serve --reload`: redeploy a function when its manifest or its code changes.

A cheap poll (stat calls in a thread, never on the event loop) compares the deploy directory's
manifests and the `.py` (and Java `.java`/`.jar`) files under each deployed function's `codePath`
with the last look. A changed manifest redeploys the functions it defines (a removed one deletes
them); a changed code file redeploys the functions made of it: their handler modules and what those
import from their `codePath` (frontend/reload_deps.py; Java functions: any file of the
`codePath`), its cached helper modules dropped so the new code is imported. A redeploy is the
one `PUT` does: in-flight invocations finish on the old code. A file that fails to parse, import,
compile or validate leaves the old revision serving and is logged with its file and line. For the
single-process dev loop only.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from frontend.reload_deps import code_files, forget_modules
from runtime.deployment import function_key
from runtime.errors import FunctionServiceError
from runtime.manifest import FunctionSpec, load_manifest_file
from runtime.registry import Registry

__all__ = ("Reloader",)

log = logging.getLogger("fnstream.reload")

Snapshot = dict[Path, tuple[int, int]]  # file -> (mtime_ns, size)
_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_CODE_SUFFIXES = (".py", ".java", ".jar")  # Java sources are compiled again by the redeploy
_SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache"})
MAX_WATCHED_FILES = 20_000  # a codePath as wide as a home directory is not watched file by file


def _stat_into(out: Snapshot, path: Path) -> None:
    try:
        st = path.stat()
    except OSError:
        return
    out[path] = (st.st_mtime_ns, st.st_size)


def _scan(deploy_dir: Path, code_paths: list[Path]) -> tuple[Snapshot, Snapshot]:
    """(manifests, code files): runs in a worker thread."""
    manifests: Snapshot = {}
    if deploy_dir.is_dir():
        for entry in os.scandir(deploy_dir):
            if entry.is_file() and entry.name.endswith(_MANIFEST_SUFFIXES):
                _stat_into(manifests, Path(entry.path))
    code: Snapshot = {}
    for root in code_paths:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for name in filenames:
                if name.endswith(_CODE_SUFFIXES):
                    _stat_into(code, Path(dirpath) / name)
            if len(code) > MAX_WATCHED_FILES:
                return manifests, code
    return manifests, code


def _changed(before: Snapshot, after: Snapshot) -> set[Path]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


class Reloader:
    """Polls every `interval` seconds while the app runs; use `context` as an aiohttp cleanup_ctx."""

    def __init__(self, registry: Registry, deploy_dir: Path, interval: float = 0.5) -> None:
        self.registry = registry
        self.deploy_dir = deploy_dir.resolve()
        self.interval = interval
        self._manifests: Snapshot = {}
        self._code: Snapshot = {}
        self._defined: dict[Path, list[str]] = {}  # manifest file -> keys (`function_key`) it deployed
        self._files: dict[str, set[Path] | None] = {}  # function key -> its code files at its last deploy

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        await self._look()  # the baseline: what is deployed now came from these files
        for path in self._manifests:
            self._defined[path] = [function_key(s.tenant, s.name) for s in self._parse(path) or []]
        for dep in self.registry.list():
            self._files[dep.key] = await asyncio.to_thread(code_files, dep.spec)
        log.info("reload: watching %s and the code of %d function(s)", self.deploy_dir, len(self.registry))
        task = asyncio.create_task(self._run(), name="fnstream-reload")
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    def _code_paths(self) -> list[Path]:
        return sorted({d.spec.codePath for d in self.registry.list()})

    async def _look(self) -> tuple[set[Path], set[Path]]:
        manifests, code = await asyncio.to_thread(_scan, self.deploy_dir, self._code_paths())
        changed = _changed(self._manifests, manifests), _changed(self._code, code)
        self._manifests, self._code = manifests, code
        return changed

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                manifests, code = await self._look()
                if manifests or code:
                    await self.apply(manifests, code)
            except Exception:
                log.exception("reload: unexpected error")

    def _parse(self, path: Path) -> list[FunctionSpec] | None:
        try:
            return load_manifest_file(path)
        except FunctionServiceError as exc:
            log.error("reload: %s: not reloaded, the running revision stays: %s", path, exc.message)
            return None

    async def apply(self, manifests: set[Path], code: set[Path]) -> None:
        """Redeploy what the changed files define or hold, one function at a time."""
        wanted: dict[str, tuple[FunctionSpec, Path]] = {}
        for path in sorted(manifests):
            if not path.exists():
                for name in self._defined.pop(path, []):
                    if name in self.registry:
                        self.registry.delete(name)
                        log.info("reload: deleted %s (its manifest %s was removed)", name, path)
                continue
            specs = self._parse(path)
            if specs is None:
                continue
            keys = [function_key(s.tenant, s.name) for s in specs]  # names are per tenant
            self._defined[path] = keys
            for key, spec in zip(keys, specs, strict=True):
                wanted[key] = (spec, path)
        for dep in self.registry.list():
            if dep.key not in wanted:
                touched = await self._touched(dep.key, dep.spec, code)
                if touched:
                    wanted[dep.key] = (dep.spec, touched[0])
        stale = set(code)
        for key, (spec, _) in wanted.items():
            now = await asyncio.to_thread(code_files, spec)
            stale |= now or set()
            stale |= self._files.get(key) or set()
        forget_modules(stale)
        for name, (spec, cause) in wanted.items():
            await self._redeploy(name, spec, cause)
            self._files[name] = await asyncio.to_thread(code_files, spec)

    async def _touched(self, name: str, spec: FunctionSpec, code: set[Path]) -> list[Path]:
        """The changed files `name` is made of, now or at its last deploy (an import just removed counts)."""
        mine = sorted(p for p in code if spec.codePath in p.parents)
        if not mine:
            return []
        files = await asyncio.to_thread(code_files, spec)
        if files is None or self._files.get(name, set()) is None:
            return mine  # Java: any file of the codePath
        files |= self._files.get(name) or set()
        return [p for p in mine if p in files]

    async def _redeploy(self, name: str, spec: FunctionSpec, cause: Path) -> None:
        old = self.registry.by_key(name).revision if name in self.registry else None
        try:
            deployed = await self.registry.adeploy([spec])
        except FunctionServiceError as exc:
            keep = f"revision {old} keeps serving" if old is not None else "not deployed"
            log.error("reload: %s changed; %s: %s", cause, keep, exc.message)
            return
        log.info("reload: %s changed; %s is now revision %d", cause, name, self.registry.by_key(name).revision)
        del deployed
