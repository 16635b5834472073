"""fnstream's HTTP frontend (aiohttp): routes, SSE encoding, auth, admin API and the CLI."""
from .shadowing import check_own_packages

check_own_packages()  # before anything imports `runtime`: a shadowing module gets a clear error

from .app import build_app, build_registry, serve  # noqa: E402

__all__ = ("build_app", "build_registry", "serve")
