"""`import yr` for openYuanrong handler code, when no real `yr` package is installed.

`install()` appends this directory to `sys.path` (so a real `yr` found earlier always wins);
the `yr` package in it maps openYuanrong's data-stream API onto fnstream's named streams.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ("install",)

_DIR = str(Path(__file__).resolve().parent)


def install() -> bool:
    """Make `import yr` work; False when a real `yr` is importable (then nothing is changed)."""
    if _DIR in sys.path:
        return True
    if importlib.util.find_spec("yr") is not None:
        return False
    sys.path.append(_DIR)
    return True
