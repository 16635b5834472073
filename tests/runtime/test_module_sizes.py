"""No module of runtime/ or frontend/ over 450 lines (CONTRIBUTING.md): one past it is split by
concern, not trimmed of its comments. The web console's script (frontend/console/) is no module."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450
MODULES = sorted(p for pkg in ("runtime", "frontend") for p in (ROOT / pkg).rglob("*.py"))


def test_the_modules_are_found() -> None:
    assert {"runtime/node.py", "runtime/jobs/runner.py", "frontend/app.py"} <= {
        str(p.relative_to(ROOT)) for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_at_most_450_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it by concern"
