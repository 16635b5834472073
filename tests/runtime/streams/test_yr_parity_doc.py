"""docs/yr.md's parity table, held to the shim: every supported or differs row names an object
fnstream's `yr` has, taking the documented parameters by name, in order, with the documented
defaults; every absent row names one it lacks. So the table cannot drift from the code."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runtime.yr_compat import install

DOC = Path(__file__).resolve().parents[3] / "docs" / "yr.md"
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| `(?P<sig>[^`]+)` \| (?P<status>supported|differs|absent) \| .+ \|$")
MISSING = object()


def _rows() -> list[tuple[str, str, str]]:
    rows = [(m["name"], m["sig"], m["status"]) for m in map(ROW.match, DOC.read_text().splitlines()) if m]
    assert len(rows) >= 15, "docs/yr.md lost its parity table"
    return rows


def _shim() -> ModuleType:
    install()
    yr = importlib.import_module("yr")
    assert getattr(yr, "FNSTREAM_SHIM", False), "a real openYuanrong `yr` is installed; this checks the shim"
    return yr


def _resolve(name: str) -> Any:
    """`yr.x`, `yr.stream.X` (a module of the shim), or `Producer.send` (a method of yr.Producer)."""
    parts = name.split(".")
    if parts[0] != "yr":
        parts = ["yr", *parts]
    obj: Any = _shim()
    for i, part in enumerate(parts[1:], start=1):
        nxt = getattr(obj, part, MISSING)
        if nxt is MISSING and isinstance(obj, ModuleType):
            try:
                nxt = importlib.import_module(".".join(parts[:i + 1]))
            except ImportError:
                return MISSING
        if nxt is MISSING:
            return MISSING
        obj = nxt
    return obj


def _documented(sig: str) -> list[ast.arg | tuple[ast.arg, ast.expr]]:
    """The parameters of `name(...) -> T` as written in the table (parsed as a def, not run)."""
    fn = ast.parse(f"def {sig.split('->')[0].strip()}: pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    return [a if d is None else (a, d) for a, d in zip(args, defaults, strict=True)]


def _default(node: ast.expr, yr: ModuleType) -> Any:
    """A documented default's value; MISSING for a factory (`field(default_factory=...)`)."""
    if isinstance(node, ast.Call):
        return MISSING
    return eval(compile(ast.Expression(node), "<yr.md>", "eval"), {"__builtins__": {}}, vars(yr))


ROWS = _rows()


@pytest.mark.parametrize("name, sig, status", ROWS, ids=[r[0] for r in ROWS])
def test_row_matches_the_shim(name: str, sig: str, status: str) -> None:
    obj = _resolve(name)
    if status == "absent":
        assert obj is MISSING, f"{name} exists in the shim: the table says absent"
        return
    assert obj is not MISSING, f"{name} is documented as {status} but the shim has no such object"
    if "(Enum):" in sig:
        members = dict(re.findall(r"(\w+) = (\d+)", sig.split("(Enum):", 1)[1]))
        assert {m.name: str(m.value) for m in obj} == members
        return
    params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    catch_all = any(p.kind == p.VAR_POSITIONAL for p in params) and any(p.kind == p.VAR_KEYWORD for p in params)
    documented = _documented(sig)
    for i, entry in enumerate(documented):
        arg, default = entry if isinstance(entry, tuple) else (entry, None)
        if catch_all and i >= len(positional):
            continue  # *args, **kwargs takes it either way
        assert i < len(positional) and positional[i].name == arg.arg, \
            f"{name}: parameter {i} is {arg.arg!r} in openYuanrong, the shim has {[p.name for p in positional]}"
        if default is not None:
            want = _default(default, _shim())
            have = positional[i].default
            assert have is not inspect.Parameter.empty, f"{name}: {arg.arg!r} has a default in openYuanrong"
            if want is not MISSING:
                assert have == want, f"{name}: {arg.arg!r} defaults to {have!r}, openYuanrong's to {want!r}"
    for extra in positional[len(documented):]:
        assert extra.default is not inspect.Parameter.empty, f"{name}: the shim requires {extra.name!r} as well"
