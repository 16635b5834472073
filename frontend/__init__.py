"""fnstream's HTTP frontend (aiohttp): routes, SSE encoding, auth, admin API and the CLI.

`build_app` and `serve` are imported on first use: the CLI's `--help`, `invoke`
and `deploy` need none of the app (importing it costs ~0.4 s).
"""
from typing import Any

from .shadowing import check_own_packages

check_own_packages()  # before anything imports `runtime`: a shadowing module gets a clear error

__all__ = ("build_app", "serve")


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app
        return getattr(app, name)
    raise AttributeError(f"module 'frontend' has no attribute {name!r}")
