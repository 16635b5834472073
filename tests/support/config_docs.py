"""docs/configuration.md, generated from the pydantic models of runtime/config.py.

The models' field descriptions are the one place a configuration key is described; this module
renders them (with each key's type, default and the shipped config/default.yaml's value) as the
reference page. `scripts/gen-config-docs` rewrites the page; tests/runtime/test_config_docs.py fails
while the committed page differs from what this renders.
"""
from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from runtime.config import Config, packaged_default_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"

HEADER = """\
# Configuration

<!-- Generated from runtime/config.py by scripts/gen-config-docs: edit the field descriptions there,
     then regenerate. tests/runtime/test_config_docs.py fails while this page is stale. -->

`fnstream serve` and `fnstream worker` read one YAML file — `--config FILE`, else
`./config/default.yaml` when the current directory has one (a project made by `fnstream init`, or
this checkout), else the defaults shipped in the package (see [CLI and projects](cli.md)) — and
`-s key=value` overrides on top (repeatable; the value is YAML, e.g. `-s 'auth.tokens=[]'`).
Unknown keys and wrong types stop the server at start with the key, the file and what was
expected. Relative paths are resolved against the config file's directory, except `jobs.path`,
which is inside the data directory.

**Data directory.** What the server must remember across restarts — the SQLite job store, with the
functions deployed through the admin API — goes to `runtime.dataDir`: `.fnstream/` in the directory
the server runs in unless set (created when first needed; the checkout's `.gitignore` lists it).
Nothing is written beside the config file, so `fnstream serve` in an empty directory creates only
`.fnstream/`, and two servers run from one directory need a data directory each
(`-s runtime.dataDir=...`): a second server refuses a job store that another one holds.

Every key follows, with its default; where the shipped `config/default.yaml` sets another value,
the table says so.
"""


def _yaml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip()
    return "`" + text.removesuffix("\n...").strip() + "`"


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [_type(a) for a in args if a is not type(None)]
        return " or ".join(named) + (", or unset" if type(None) in args else "")
    if origin is list:
        return f"list of {_type(args[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, itself or as the items of a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _rows(model: type[BaseModel], prefix: str, defaults: dict[str, Any] | None, shipped: Any) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = prefix + name
        sub = _model_of(field.annotation)
        if sub is not None and field.annotation is sub:
            continue  # a section: rendered under its own heading
        if defaults is None:
            default = "required" if field.is_required() else _yaml(field.get_default(call_default_factory=True))
        else:
            default = _yaml(defaults[name])
        if isinstance(shipped, dict) and name in shipped and (defaults is None or shipped[name] != defaults[name]):
            default += f" (shipped: {_yaml(shipped[name])})"
        rows.append(f"| `{key}` | {_type(field.annotation)} | {default} | {_cell(field.description or '')} |")
        if sub is not None:  # a list of mappings: one row per item key
            rows += _rows(sub, key + "[].", None, None)
    return rows


def _sections(model: type[BaseModel], prefix: str, defaults: dict[str, Any], shipped: Any,
              depth: int) -> list[str]:
    out: list[str] = []
    rows = _rows(model, prefix, defaults, shipped)
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for name, field in model.model_fields.items():
        if field.exclude or _model_of(field.annotation) is not field.annotation or field.annotation is None:
            continue
        sub = _model_of(field.annotation)
        assert sub is not None
        key = prefix + name
        out += [f"{'#' * depth} `{key}`", ""]
        intro = field.description or (sub.__doc__ or "").strip().split("\n\n")[0]
        if intro:
            intro = " ".join(intro.split())
            out += [intro[0].upper() + intro[1:] + ("" if intro.endswith(".") else "."), ""]
        child = shipped.get(name) if isinstance(shipped, dict) else None
        out += _sections(sub, key + ".", defaults[name], child, min(depth + 1, 3))
    return out


def render() -> str:
    """The whole page."""
    defaults = Config.model_validate({}).model_dump(mode="json")
    shipped = yaml.safe_load(packaged_default_config().read_text()) or {}
    lines = [HEADER, *_sections(Config, "", defaults, shipped, 2)]
    return "\n".join(lines).rstrip("\n") + "\n"


def undescribed(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Keys with no description: every key must say what it means."""
    missing = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        if not field.description:
            missing.append(prefix + name)
        sub = _model_of(field.annotation)
        if sub is not None:
            missing += undescribed(sub, prefix + name + ("[]." if sub is not field.annotation else "."))
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE} is stale: run scripts/gen-config-docs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
