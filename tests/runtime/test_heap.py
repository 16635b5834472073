"""runtime/heap.py: start-up's objects are frozen out of every later full collection."""
from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterator

import pytest

from runtime.heap import FULL_EVERY, freeze_startup, thaw
from runtime.manifest import FunctionSpec, parse_manifest
from runtime.registry import Registry
from tests.support.servers import HANDLERS


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    """The test session's collector as it was: nothing frozen, Python's thresholds."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_freeze_startup_moves_what_start_up_made_out_of_the_collector() -> None:
    made = [[i] for i in range(1000)]  # tracked objects alive at the freeze
    freeze_startup()
    assert gc.get_freeze_count() >= len(made)
    walked = {id(o) for o in gc.get_objects()}  # what collections walk (not the permanent generation)
    assert not any(id(x) in walked for x in made)


def test_full_collections_wait_for_many_middle_ones_once_frozen() -> None:
    """With start-up frozen, Python's own gate (a quarter more old objects) opens after a few
    thousand promotions: the count gate is raised, the young generations are left as they are."""
    gc.set_threshold(700, 10, 10)
    freeze_startup(collect=False)
    assert gc.get_threshold() == (700, 10, FULL_EVERY)
    gc.set_threshold(700, 10, 500)  # one set higher still is kept
    freeze_startup(collect=False)
    assert gc.get_threshold() == (700, 10, 500)


def test_a_worker_process_keeps_pythons_full_collections() -> None:
    """It runs under its memory limit, and CPython raises MemoryError without collecting first."""
    gc.set_threshold(700, 10, 10)
    freeze_startup(collect=False, rarer_full=False)
    assert gc.get_threshold() == (700, 10, 10)


def test_thaw_collects_what_retired_code_alone_held() -> None:
    """With full collections rare, a retired module's cycles (and a model it holds) would wait."""
    class Model:
        pass

    model = Model()
    cycle: list[object] = [model]
    cycle.append(cycle)
    held = weakref.ref(model)
    freeze_startup(collect=False)
    del cycle, model
    thaw()
    assert held() is None and gc.get_freeze_count() == 0


def test_a_worker_process_freezes_without_a_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    freeze_startup(collect=False)
    assert gc.get_freeze_count() > 0 and collected == []


@pytest.fixture
def specs() -> list[FunctionSpec]:
    """Parsed before the loop runs (resolving codePath touches the file system)."""
    return parse_manifest(json.dumps([{"name": "frozen-d", "handler": "testfns.returns_none",
                                       "codePath": str(HANDLERS)}]), "test", HANDLERS)


async def test_retiring_code_loaded_at_start_up_gives_the_frozen_objects_back(specs: list[FunctionSpec]) -> None:
    """A deployment replaced (or deleted) after the freeze: its first code's objects must be
    collectable again, not kept for the process's life."""
    registry = Registry([HANDLERS])
    await registry.adeploy(specs)
    try:
        freeze_startup()
        assert gc.get_freeze_count() > 0
        await registry.adeploy(specs)          # replaced: the first revision retires
        assert gc.get_freeze_count() == 0
    finally:
        await registry.stop_workers()
