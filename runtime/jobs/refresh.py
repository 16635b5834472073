"""RunPod's `refresh_worker`: the instance that ran a job is recycled before it takes another.

On RunPod the worker's pod stops after such a job and a fresh one starts. Here an in-process
function's code is imported afresh (new module state) and its initializer runs again before
the next invocation; invocations in flight finish on the code they started with.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..deployment import Deployment
from ..errors import FunctionServiceError
from ..loader import load_code

__all__ = ("take_refresh_flag", "refresh_instance")

log = logging.getLogger("fnstream.jobs")


def take_refresh_flag(result: Any) -> tuple[Any, bool]:
    """RunPod: a returned dict's `refresh_worker` key asks for a refresh and is not part of the output."""
    if isinstance(result, dict) and "refresh_worker" in result:
        rest = {k: v for k, v in result.items() if k != "refresh_worker"}
        return rest, bool(result["refresh_worker"])
    return result, False


async def refresh_instance(dep: Deployment, code_roots: list[Path]) -> None:
    """Import `dep`'s code again (off the loop); on failure keep the old code and say why."""
    try:
        code = await asyncio.to_thread(load_code, dep.spec, code_roots)
    except FunctionServiceError as exc:
        log.error("function %s: refresh_worker: re-importing the code failed, the old instance goes on: %s",
                  dep.name, exc.message)
        return
    dep.replace_code(code)
    log.info("function %s: refresh_worker: a fresh instance takes the next job", dep.name)
