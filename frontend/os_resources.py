"""The process's operating-system resources the listener manages: its file-descriptor limit and
the C allocator's free memory (given back after a burst of headers held before authentication)."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource
from typing import Any

__all__ = ("malloc_trim", "raise_fd_limit")

log = logging.getLogger("fnstream.frontend")


def _load_malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def malloc_trim() -> None:
    """Give the allocator's free memory back to the system (glibc; nothing elsewhere)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def raise_fd_limit(max_connections: int) -> None:
    """Lift the soft file-descriptor limit towards the hard one so `maxConnections` can be reached."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + 256  # listener, Redis, logs, worker pipes
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            log.warning("file descriptor limit %d is below frontend.limits.maxConnections=%d; connections past "
                        "it fail at accept instead of getting 503", new, max_connections)
