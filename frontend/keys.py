"""Typed application keys shared by the routes."""
from __future__ import annotations

from aiohttp import web

from runtime.config import Config
from runtime.executor import Executor
from runtime.registry import Registry

__all__ = ("CONFIG", "REGISTRY", "EXECUTOR")

CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", Registry)
EXECUTOR = web.AppKey("executor", Executor)
