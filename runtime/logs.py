"""Log lines: today's text format, or `logging.format: json` (one JSON object per line).

Every record made while an invocation (or an HTTP request) runs carries its trace id, function
and invocation id, taken from a context variable: asyncio tasks copy it, and the executor runs
thread handlers inside a copy of it, so handler logs are tagged too. A process worker
(runtime/process/child/main.py) sets the same variable around each invocation it runs and sends its
records to the server with those fields and its pid (`worker`), which are logged here as they are.
"""
from __future__ import annotations

import contextvars
import datetime
import json
import logging
from typing import Literal

__all__ = ("set_log_context", "log_context", "LogContextFilter", "JsonFormatter", "TextFormatter",
           "configure_logging", "TEXT_FORMAT")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# (trace id, function name, invocation id); "" where unknown.
_CONTEXT: contextvars.ContextVar[tuple[str, str, str]] = contextvars.ContextVar("fnstream_log_context",
                                                                                  default=("", "", ""))


def set_log_context(trace_id: str, function: str = "", invocation_id: str = "") -> None:
    """Tag the log records of the current task (and tasks it starts) from now on."""
    _CONTEXT.set((trace_id, function, invocation_id))


def log_context() -> tuple[str, str, str]:
    """(trace id, function, invocation id) of the current task or thread; "" where unknown."""
    return _CONTEXT.get()


class LogContextFilter(logging.Filter):
    """Adds `trace_id`, `function` and `invocation_id` to every record (handler-level filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id, function, invocation_id = _CONTEXT.get()
        if not hasattr(record, "trace_id"):
            record.trace_id = trace_id
        if not hasattr(record, "function"):
            record.function = function
        if not hasattr(record, "invocation_id"):
            record.invocation_id = invocation_id
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, trace_id, function, invocation_id."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("trace_id", "function", "invocation_id", "worker"):
            value = getattr(record, key, "")
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT; a process worker's record says which worker: `[worker <pid>] message`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        worker = getattr(record, "worker", None)
        if worker is None:
            return super().formatMessage(record)
        message = record.message
        record.message = f"[worker {worker}] {message}"
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


def configure_logging(fmt: Literal["text", "json"], level: str | int = "INFO") -> None:
    """Replace the root handlers with one stderr handler in `fmt`."""
    handler = logging.StreamHandler()
    handler.addFilter(LogContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
