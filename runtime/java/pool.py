"""Worker JVMs: the process pool of a Java function, launching `java` instead of a Python worker.

Everything else — slots (instanceConcurrency as threads of one JVM), scaling, sessions, timeouts,
crash supervision, the frame protocol — is the process pool's (runtime/process). The JVM speaks
the same protocol over the worker's end of the socket pair, inherited as a descriptor other than
0/1/2 and named on its command line: its stdin is /dev/null and its stdout the server's stderr, so
a handler that writes to FileDescriptor.out, or starts a child with inheritIO(), cannot corrupt or
steal protocol bytes (and the JDK closes that descriptor in the children it starts).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

from ..errors import DeployError
from ..manifest import FunctionSpec
from ..process.pool import WorkerPool
from .build import cache_root, classpath_for, find_jdk

__all__ = ("JavaWorkerPool",)

MIN_HEAP_MB = 16
WORKER_CLASS = "org.yuanrong.fnstream.Worker"


class JavaWorkerPool(WorkerPool):
    """A WorkerPool whose workers are JVMs; the code is compiled here, at deploy, before any starts."""

    interrupts_threads = True  # a cancel interrupts the handler's thread; the JVM dies only if it ignores that

    def __init__(self, spec: FunctionSpec, code_roots: list[Path], **kwargs: Any) -> None:
        self.jdk = find_jdk(spec.name)
        try:
            code = classpath_for(self.jdk, spec.name, spec.codePath)
        except OSError as exc:
            raise DeployError(f"function {spec.name!r}: cannot compile into the Java cache {cache_root()}: {exc} "
                              "(set FNSTREAM_JAVA_CACHE to a writable directory)") from None
        self.classpath = code.classpath
        self.user_classpath = os.pathsep.join(code.own)
        refs = "\0".join(str(r) for r in (spec.handler, spec.initializer, spec.preStop))
        self._validated_marker = cache_root() / "validated" / (
            f"{code.key}-{hashlib.sha256(refs.encode()).hexdigest()[:16]}")
        super().__init__(spec, code_roots, **kwargs)

    def start(self) -> None:
        """With `minInstances: 0`, code whose handler a JVM already resolved (same classes, same
        references) deploys without starting one: its first invocation is the cold start."""
        if self.min_instances == 0 and self._validated_marker.exists():
            self._on_loaded("sync", None)
            return
        super().start()

    def _on_loaded(self, kind: str | None, error: str | None, runpod: dict[str, Any] | None = None) -> None:
        if kind is not None and error is None and not self._loaded.is_set():
            try:
                self._validated_marker.parent.mkdir(parents=True, exist_ok=True)
                self._validated_marker.touch()
            except OSError:
                pass  # only a later deploy's shortcut is lost
        super()._on_loaded(kind, error, runpod)

    def command(self) -> list[str]:
        heap = max(MIN_HEAP_MB, self.spec.memory)
        return [self.jdk.java, f"-Xmx{heap}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
                "-Djava.awt.headless=true", f"-Dfnstream.usercp={self.user_classpath}",
                "--add-opens", "java.base/java.io=ALL-UNNAMED",  # the worker wraps its inherited descriptor
                *shlex.split(os.environ.get("FNSTREAM_JAVA_OPTS", "")),  # the operator's JVM flags last
                "-cp", os.pathsep.join(self.classpath), WORKER_CLASS]

    def launch(self, child_sock: socket.socket) -> subprocess.Popen[bytes]:
        fd = child_sock.fileno()
        return subprocess.Popen([*self.command(), str(fd)], pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                stdout=2, cwd=str(self.spec.codePath),
                                env={**os.environ, "MALLOC_ARENA_MAX": "2"}, process_group=0)
