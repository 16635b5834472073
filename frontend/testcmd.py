"""`fnstream test`: run a project's tests (the ones `fnstream init` writes) with pytest.

pytest is not a dependency of the product, so `init`'s hint would otherwise end in "command not
found": this runs it when it is importable in fnstream's own environment (where the tests'
`from frontend.app import ...` resolves) and otherwise says in one line what to install.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

__all__ = ("add_command", "cmd_test")

MISSING = ("fnstream test: pytest is not installed in {python}'s environment; "
           "pip install pytest (or 'fnstream[test]'), then run it again")


def cmd_test(args: argparse.Namespace) -> int:
    if find_spec("pytest") is None:
        print(MISSING.format(python=sys.executable), file=sys.stderr)
        return 2
    directory = Path(args.dir)
    argv = [sys.executable, "-m", "pytest", *(args.paths or ["tests"])]
    return subprocess.call(argv, cwd=directory)


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("test", help="run the project's tests (tests/) with pytest")
    p.add_argument("--dir", default=".", help="project directory (default: .)")
    p.add_argument("paths", nargs="*", metavar="ARG",
                   help="pytest's arguments, after -- when they start with - (default: tests)")
    p.set_defaults(func=cmd_test)
