"""fnstream's HTTP frontend (aiohttp): routes, SSE encoding, auth, admin API and the CLI."""
from .app import build_app, build_registry, serve

__all__ = ("build_app", "build_registry", "serve")
