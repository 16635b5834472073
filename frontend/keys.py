"""Typed application keys shared by the routes."""
from __future__ import annotations

from aiohttp import web

from runtime.config import AuthToken, Config
from runtime.dispatch import Dispatcher
from runtime.durable import DurableOutputs
from runtime.executor import Executor
from runtime.lifecycle import Lifecycle
from runtime.node import Node
from runtime.registry import Registry
from runtime.streams import AbstractBroker

__all__ = ("CONFIG", "REGISTRY", "EXECUTOR", "DISPATCHER", "LIFECYCLE", "TRACE_ID", "PRINCIPAL", "BROKER", "OUTPUTS",
           "NODE")

NODE = web.AppKey("node", Node)   # the runtime: every object below is one of its own
CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", Registry)
EXECUTOR = web.AppKey("executor", Executor)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)   # the one way routes run functions
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)      # the shutdown sequence (set while the app runs)
BROKER = web.AppKey("broker", AbstractBroker)
OUTPUTS = web.AppKey("durable_outputs", DurableOutputs)  # SSE invocations' kept output, by id

# Per-request state.
TRACE_ID = web.RequestKey("trace_id", str)
PRINCIPAL = web.RequestKey("principal", AuthToken)
