"""The worker process's entry point: `python -m runtime.process.worker FD`.

The pool (runtime/process/pool.py `launch`) starts this module; the program itself is the
runtime/process/child package, which keeps the child's side of the process boundary in one place.
"""
from __future__ import annotations

from .child.main import main

__all__ = ("main",)

if __name__ == "__main__":
    main()
