"""Backends of the bundled `chat` function: `standin` (no weights) and `upstream` (a proxy)."""
from .request import OpenAIRequest, parse_event
from .standin import StandinSettings, generate
from .upstream import UpstreamError, UpstreamSettings, relay

__all__ = ("OpenAIRequest", "parse_event", "StandinSettings", "generate",
           "UpstreamError", "UpstreamSettings", "relay")
