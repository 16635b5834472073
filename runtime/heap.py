"""A serving process's garbage collector: what start-up made is set aside once serving begins.

CPython's full collections walk every object the collector tracks. Start-up (imports, config,
manifests, the deployed code, a worker's initializer and what it loaded) is most of them and lives
as long as the process, yet every full collection walked it again: on the streaming path they took
a tenth of a server's time (three in 2,000 streams of 100 events, 36 ms each). `freeze_startup`
collects once and moves what is left to the permanent generation (`gc.freeze`), so later
collections walk only what serving made. What start-up made and later drops is then never freed
by the collector (a deployment replaced at run time keeps its first code's cycles in memory):
bounded by what start-up made, once.
"""
from __future__ import annotations

import gc

__all__ = ("freeze_startup",)


def freeze_startup(collect: bool = True) -> None:
    """Collect what start-up left as garbage, then freeze the rest (`fnstream serve` once it
    listens, `fnstream worker` once its node runs). A worker process, once its code is initialized,
    freezes without the collection (its cold start would wait for it; `gc.freeze` alone is a
    list splice), keeping what little garbage its start-up left."""
    if collect:
        gc.collect()
    gc.freeze()
