"""A start-up check that the `runtime` package fnstream imports is fnstream's own.

fnstream's two top-level packages have common names. A same-named module earlier on `sys.path`
(PYTHONPATH, or the current directory under `python -m`) would otherwise fail far from the cause
(`'runtime' is not a package`) or, worse, half work; this says which file shadows which.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ("ShadowedPackageError", "check_own_packages")


class ShadowedPackageError(ImportError):
    """`runtime` resolves to something other than the package installed beside this `frontend`."""


def check_own_packages() -> None:
    """Raise ShadowedPackageError unless `runtime` is the sibling of this `frontend` package."""
    here = Path(__file__).resolve().parent
    expected = here.parent / "runtime" / "__init__.py"
    try:
        spec = importlib.util.find_spec("runtime")
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin != expected:
        found = origin or (list(spec.submodule_search_locations or []) if spec else None) or "nothing"
        raise ShadowedPackageError(
            f"fnstream: the module 'runtime' resolves to {found}, not fnstream's own package {expected.parent} "
            f"(beside {here}); a same-named module or directory on sys.path shadows it. Rename it, or take its "
            "directory off PYTHONPATH / run fnstream from another directory.")
