"""`fnstream init` and `fnstream new`: write a project, or one function, from templates.

Nothing is overwritten unless asked (`force`): a refusal names every file that exists. The
project's config/default.yaml is rendered from the config model itself (every key, each with its
default), so it lists exactly the keys this fnstream knows.
"""
from __future__ import annotations

import argparse
import keyword
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .templates import TEMPLATES

if TYPE_CHECKING:  # the rest is imported where used: the CLI parser builds from this module
    from pydantic import BaseModel

__all__ = (
    "ScaffoldError",
    "Written",
    "add_commands",
    "bundled_examples",
    "init_project",
    "new_function",
    "render_config",
    "server_url",
)

RESERVED_MODULES = frozenset({"runtime", "frontend"})  # fnstream's own packages would shadow them
# A Java template's package is the module name; these cannot be one (Python's keywords are refused already).
_JAVA_KEYWORDS = frozenset({
    "abstract", "boolean", "byte", "case", "catch", "char", "const", "default", "do", "double", "enum",
    "extends", "final", "float", "goto", "implements", "instanceof", "int", "interface", "long", "native",
    "new", "package", "private", "protected", "public", "short", "static", "strictfp", "super", "switch",
    "synchronized", "this", "throw", "throws", "transient", "void", "volatile", "true", "false", "null",
})


class ScaffoldError(Exception):
    """What `init` / `new` refused to do, as a message for the user."""


@dataclass(frozen=True)
class Written:
    """The files one command wrote (relative to its directory) and the next command to run."""

    files: list[Path]
    next_steps: list[str]


def bundled_examples() -> tuple[Path, Path]:
    """(functions dir, deploy dir) of the bundled examples: the wheel's copy or the checkout's."""
    try:
        from importlib.resources import files
        # Join a file name first: a namespace package's files() is a MultiplexedPath, whose str() is no path.
        fns = Path(str(files("frontend._examples.functions") / "hello.py")).parent
        dep = Path(str(files("frontend._examples.deploy") / "hello.yaml")).parent
        if (dep / "hello.yaml").is_file() and (fns / "hello.py").is_file():
            return fns, dep
    except (ModuleNotFoundError, TypeError):
        pass
    root = Path(__file__).resolve().parent.parent
    return root / "functions", root / "deploy"


def _yaml_value(value: Any) -> str:
    import yaml
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip().removesuffix(
        "\n...").strip()


def _render(model: type[BaseModel], defaults: dict[str, Any], shipped: dict[str, Any] | None, indent: int,
            lines: list[str]) -> None:
    """One line per key; a key the shipped file does not set is commented out as `# ` + its line,
    so removing the leading `# ` of a key (and of its section) turns it on."""
    from pydantic import BaseModel
    pad = "  " * indent
    for key, field in model.model_fields.items():
        if field.exclude:
            continue
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            child = shipped.get(key) if shipped is not None else None
            active = isinstance(child, dict)
            lines.append(f"{'' if active else '# '}{pad}{key}:")
            _render(sub, defaults[key], child if active else None, indent + 1, lines)
            continue
        default = _yaml_value(defaults[key])
        if shipped is not None and key in shipped:
            value, notes = _yaml_value(shipped[key]), [field.description or ""]
            if shipped[key] != defaults[key]:
                notes.append(f"default: {default}")
            note = "; ".join(n for n in notes if n)
            lines.append(f"{pad}{key}: {value}" + (f"   # {note}" if note else ""))
        else:
            note = f"   # {field.description}" if field.description else ""
            lines.append(f"# {pad}{key}: {default}{note}")


def render_config() -> str:
    """config/default.yaml for a new project: the shipped settings active, every other key commented
    out with its default (uncomment to change). Relative paths resolve against the file's directory."""
    import yaml

    from runtime.config import Config, packaged_default_config
    shipped = yaml.safe_load(packaged_default_config().read_text()) or {}
    lines = ["# fnstream configuration (written by `fnstream init`). Every key is listed with its default;",
             "# uncomment a line to change it. Relative paths resolve against this file's directory.",
             "# Reference: docs/configuration.md (every key, its default and meaning)."]
    _render(Config, Config.model_validate({}).model_dump(mode="json"), shipped, 0, lines)
    return "\n".join(lines) + "\n"


_TEST = '''"""The example function, against the in-process app (no server, no port): run with `pytest`."""
import asyncio
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from frontend.app import SERVER_KWARGS, build_app
from runtime.config import load_config

PROJECT = Path(__file__).resolve().parent.parent


async def _invoke_hello():
    # A job store of its own (in memory): a running `fnstream serve` holds the project's file.
    app = build_app(load_config(PROJECT / "config" / "default.yaml", ["jobs.store=memory"]))
    async with TestClient(TestServer(app, **SERVER_KWARGS)) as client:
        resp = await client.post("/serverless/v1/functions/hello/invocations", json={{}},
                                 headers={{"Accept": "text/event-stream"}})
        return resp.status, await resp.text()


def test_hello_streams_its_event_then_ok():
    status, body = asyncio.run(_invoke_hello())
    assert status == 200
    assert 'data: {{"event": "this is a stream"}}' in body
    assert 'data: "ok"' in body
    assert body.endswith("data: [DONE]\\n\\n")
'''


def _write_all(root: Path, files: dict[Path, str | Path], force: bool) -> list[Path]:
    """Write text (or copy a file) to each relative path; refuse listing every existing one first."""
    existing = [rel for rel in files if (root / rel).exists()]
    if existing and not force:
        raise ScaffoldError("refusing to overwrite existing file(s): " + ", ".join(str(p) for p in existing)
                            + " (use --force to overwrite)")
    for rel, content in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_text(content)
    return list(files)


def init_project(directory: Path, *, force: bool = False, examples: bool = False) -> Written:
    """A project: config, deploy/ + functions/ with the openYuanrong streaming example, and its test.

    `examples` also copies every bundled example function (echo, ticker, chat, streams, the Java demo).
    """
    fns, dep = bundled_examples()
    files: dict[Path, str | Path] = {
        Path("config/default.yaml"): render_config(),
        Path("functions/hello.py"): fns / "hello.py",
        Path("deploy/hello.yaml"): dep / "hello.yaml",
        Path("tests/test_hello.py"): _TEST.format(),
    }
    if examples:
        for path in sorted(p for p in fns.rglob("*") if p.suffix in (".py", ".java")):
            files.setdefault(Path("functions") / path.relative_to(fns), path)
        for path in sorted(dep.glob("*.yaml")):
            files.setdefault(Path("deploy") / path.name, path)
    written = _write_all(directory, files, force)
    where = "" if directory.resolve() == Path.cwd().resolve() else f"cd {directory} && "
    return Written(written, [f"{where}fnstream serve",
                             "fnstream invoke hello --stream      # in another shell",
                             "fnstream test                       # the example's test (runs pytest)"])


def _check_name(name: str) -> str:
    """The module name for function `name`, or ScaffoldError with the manifest's own message."""
    from pydantic import ValidationError

    from runtime.manifest import FunctionSpec
    try:
        FunctionSpec.model_validate({"name": name, "handler": "module.handler"})
    except ValidationError as exc:
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ScaffoldError(f"invalid function name {name!r}: {reason}") from None
    module = name.replace("-", "_")
    if keyword.iskeyword(module) or module in RESERVED_MODULES:
        raise ScaffoldError(f"invalid function name {name!r}: its module {module!r} "
                            + ("is a Python keyword" if keyword.iskeyword(module)
                               else "would be shadowed by fnstream's own package of that name"))
    return module


def new_function(directory: Path, name: str, template: str = "stream", *, force: bool = False) -> Written:
    """functions/<module>.py and deploy/<name>.yaml from a template."""
    if template not in TEMPLATES:
        raise ScaffoldError(f"unknown template {template!r}; choose one of: {', '.join(TEMPLATES)}")
    module = _check_name(name)
    tpl = TEMPLATES[template]
    handler, code_path, source = f"{module}.handler", "../functions", Path(f"functions/{module}.py")
    code = tpl.code.format(name=name) if not tpl.java else ""
    if tpl.java:  # package <module>, class <Name>: functions/<module>/<module>/<Name>.java
        if module in _JAVA_KEYWORDS:
            raise ScaffoldError(f"invalid function name {name!r}: its package {module!r} is a Java keyword")
        cls = "".join(part.capitalize() for part in module.split("_") if part) or "Handler"
        handler, code_path = f"{module}.{cls}::handler", f"../functions/{module}"
        source = Path(f"functions/{module}/{module}/{cls}.java")
        code = tpl.code.format(name=name, package=module, cls=cls)
    manifest = (f"name: {name}\ndescription: {tpl.summary} (fnstream new --template {template})\n"
                f"handler: {handler}\ncodePath: {code_path}\ntimeout: 60\n"
                + tpl.manifest_extra.format(name=name))
    from runtime.manifest import parse_manifest
    parse_manifest(manifest, f"deploy/{name}.yaml", directory / "deploy")  # a template bug fails here, not later
    files: dict[Path, str | Path] = {source: code, Path(f"deploy/{name}.yaml"): manifest}
    written = _write_all(directory, files, force)
    url = server_url(directory)
    to = "" if url == _cli_default_url() else f" --url {url}"
    stream = " --stream" if template != "plain" else ""
    steps = [f"fnstream serve                      # or, with a server running: fnstream deploy deploy/{name}.yaml{to}",
             f"fnstream invoke {name}{stream} --data '{tpl.example_data}'{to}"]
    if template == "openai":
        steps[0] = (f"fnstream serve                      # or, with a server running: fnstream deploy "
                    f"deploy/{name}.yaml{to} (no restart: /v1 routes model {name!r}, its manifest's `models:`)")
        steps[1] = (f"curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' "
                    f"-d '{{\"model\": \"{name}\", \"stream\": true, \"messages\": [{{\"role\": \"user\", "
                    f"\"content\": \"hi\"}}]}}'")
    return Written(written, steps)


def server_url(directory: Path) -> str:
    """Where `fnstream serve` run in `directory` listens (its config's frontend.host / port), as a
    client on this machine writes it: hints name the real address, not the default one."""
    from runtime.errors import ConfigError

    from .startup import load_cli_config
    try:
        frontend = load_cli_config(None, [], cwd=directory).frontend
    except ConfigError:  # `fnstream serve` reports a broken config itself
        return "http://127.0.0.1:8888"
    host = frontend.host
    if host in ("", "0.0.0.0", "::"):  # every address: this machine's loopback answers
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{frontend.port or 'PORT'}"  # port 0: a free one, printed by serve


def _cli_default_url() -> str:
    """The address the client commands use without --url (frontend/cli.py DEFAULT_URL)."""
    return os.environ.get("FNSTREAM_URL", "http://127.0.0.1:8888")


def _report(directory: Path, written: Written) -> None:
    for rel in written.files:
        print(f"created {directory / rel}")
    print("next:")
    for step in written.next_steps:
        print(f"  {step}")


def cmd_init(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    try:
        written = init_project(directory, force=args.force, examples=args.examples)
    except ScaffoldError as exc:
        print(f"fnstream init: {exc}", file=sys.stderr)
        return 1
    _report(directory, written)
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    try:
        written = new_function(directory, args.name, args.template, force=args.force)
    except ScaffoldError as exc:
        print(f"fnstream new: {exc}", file=sys.stderr)
        return 1
    _report(directory, written)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fnstream init` and `fnstream new` on the CLI's sub-command parser."""
    p = sub.add_parser("init", help="write a project: config, deploy/, functions/, a streaming example and its test")
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", help="project directory (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.add_argument("--examples", action="store_true", help="also copy every bundled example function")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("new", help="add functions/NAME.py (java: functions/NAME/) and deploy/NAME.yaml "
                                   "from a template")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--template", "-t", choices=list(TEMPLATES), default="stream",
                   help="; ".join(f"{k}: {t.summary}" for k, t in TEMPLATES.items()) + " (default: stream)")
    p.add_argument("--dir", default=".", help="project directory (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(func=cmd_new)
