"""Fixtures of the cluster tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def start_server(start_server):
    """Quiet servers: nobody reads their stdout pipe while a test runs, so a chatty one would block."""
    def factory(*args: str, env: dict | None = None):
        return start_server(*args, env={"FNSTREAM_LOG": "WARNING", **(env or {})})
    return factory
