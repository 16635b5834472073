"""Typed application keys shared by the routes."""
from __future__ import annotations

from aiohttp import web

from runtime.config import AuthToken, Config
from runtime.executor import Executor
from runtime.registry import Registry
from runtime.streams import AbstractBroker

__all__ = ("CONFIG", "REGISTRY", "EXECUTOR", "TRACE_ID", "PRINCIPAL", "BROKER")

CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", Registry)
EXECUTOR = web.AppKey("executor", Executor)
BROKER = web.AppKey("broker", AbstractBroker)

# Per-request state.
TRACE_ID = web.RequestKey("trace_id", str)
PRINCIPAL = web.RequestKey("principal", AuthToken)
