"""A serving process's garbage collector: what start-up made is set aside once serving begins.

CPython's full collections walk every object the collector tracks. Start-up (imports, config,
manifests, the deployed code, a worker's initializer and what it loaded) is most of them and lives
as long as the process, yet every full collection walked it again: on the streaming path they took
a tenth of a server's time (three in 2,000 streams of 100 events, 36 ms each). `freeze_startup`
collects once and moves what is left to the permanent generation (`gc.freeze`), so later
collections walk only what serving made. What start-up made and later drops would then never be
freed by the collector: a deployment replaced or deleted at run time gives it back (`thaw`, from
the registry), so its first code's module and globals (a loaded model, say) go as they would
have, and full collections walk start-up's objects again from then on. A worker process freezes
without collecting first (see `freeze_startup`): garbage in cycles that its imports and
initializer left stays for the worker's life, counted in its memory.

Frozen objects leave the count a full collection is weighed against (it runs once a quarter as
many objects as the last one kept have reached the oldest generation since), so with start-up
frozen a few thousand promoted objects were enough: 1000 open streams promote tens of thousands,
and full collections walked them all, 50-70 ms each, a fifth of a streaming server's time.
`freeze_startup` also makes a full collection wait for `FULL_EVERY` collections of the middle
generation (Python's default is 10) as well: cyclic garbage still goes in the young
generations, where most of it dies, and a full collection still comes, only rarer. Not in a
worker process: it runs under its function's memory limit, and CPython raises MemoryError without
collecting first, so its cyclic garbage must not wait. What retired code alone held (its module's
cycles, a model it loaded) would wait too: `thaw` collects it at once.
"""
from __future__ import annotations

import gc

__all__ = ("FULL_EVERY", "freeze_startup", "thaw")

FULL_EVERY = 100  # middle-generation collections per full collection, at least


def freeze_startup(collect: bool = True, rarer_full: bool = True) -> None:
    """Collect what start-up left as garbage, then freeze the rest (`fnstream serve` once it
    listens, `fnstream worker` once its node runs), and make full collections rarer. A worker
    process, once its code is initialized, freezes without the collection (~7 ms its cold start
    would wait for; `gc.freeze` alone is a list splice) and keeps Python's full collections."""
    if collect:
        gc.collect()
    gc.freeze()
    if rarer_full:
        young, middle, full = gc.get_threshold()
        gc.set_threshold(young, middle, max(full, FULL_EVERY))


def thaw() -> None:
    """In-process code was retired (a redeploy or a delete): give what was frozen back to the
    collector, and collect what that code alone held now, not at a full collection that may be far
    off (one full collection per retirement: tens of ms, an operator's action)."""
    if gc.get_freeze_count():
        gc.unfreeze()
    gc.collect()
