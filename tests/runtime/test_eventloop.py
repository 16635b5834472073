"""frontend.loop: which loop `fnstream serve` and `fnstream worker` run on."""
from __future__ import annotations

import asyncio
import sys

import pytest

from runtime.errors import ConfigError
from runtime.eventloop import loop_factory, loop_name, run


async def _running_loop_name() -> str:
    return loop_name(asyncio.get_running_loop())


def test_auto_runs_uvloop_where_it_is_installed_and_asyncio_on_request():
    pytest.importorskip("uvloop")
    assert run(_running_loop_name(), "auto") == "uvloop"
    assert run(_running_loop_name(), "uvloop") == "uvloop"
    assert run(_running_loop_name(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_an_explicit_uvloop_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert loop_factory("auto") is None
    assert run(_running_loop_name(), "auto") == "asyncio"
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        loop_factory("uvloop")
