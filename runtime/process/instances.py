"""How many workers a process function runs and how many invocations each takes (its manifest's
`instances`, `minInstances`/`maxInstances` and `instanceConcurrency`).

A leaf: the pool sizes itself with it, and the worker process sizes its thread pool with it
without importing its supervisor.
"""
from __future__ import annotations

import os

from ..manifest import FunctionSpec

__all__ = ("DEFAULT_ASYNC_SLOTS", "DEFAULT_SYNC_SLOTS", "instance_bounds", "instance_slots", "with_runpod_concurrency")

DEFAULT_ASYNC_SLOTS = 100  # async handlers wait on sockets: one worker serves many
DEFAULT_SYNC_SLOTS = 1     # a def handler holds a thread (and the GIL): one at a time unless raised


def with_runpod_concurrency(spec: FunctionSpec, concurrency: int | None) -> FunctionSpec:
    """RunPod's concurrency_modifier is the jobs one instance takes at once: the worker's
    `instanceConcurrency`, unless the manifest sets it."""
    if concurrency is None or "instanceConcurrency" in spec.model_fields_set:
        return spec
    return spec.model_copy(update={"instanceConcurrency": concurrency})


def instance_slots(spec: FunctionSpec, kind: str) -> int:
    """Invocations one worker runs at once: `instanceConcurrency`, or the default for the kind."""
    if spec.instanceConcurrency is not None:
        return spec.instanceConcurrency
    return DEFAULT_ASYNC_SLOTS if kind in ("async", "asyncgen") else DEFAULT_SYNC_SLOTS


def instance_bounds(spec: FunctionSpec) -> tuple[int, int]:
    """(minInstances, maxInstances): `instances` fixes both; max defaults to min(concurrency, CPUs)."""
    if spec.instances is not None:
        return spec.instances, spec.instances
    low = 1 if spec.minInstances is None else spec.minInstances
    high = spec.maxInstances or max(1, min(spec.concurrency, os.cpu_count() or 1))
    return low, max(low, high, 1)
