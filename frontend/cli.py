"""The `fnstream` command: serve, deploy, functions, delete, invoke (also --async), job, subscribe, publish.

Modules are imported by the command that needs them: `--help` and the client commands start in a
fraction of the time the server's whole import graph takes.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from runtime.errors import ConfigError, FunctionServiceError
from runtime.logs import TEXT_FORMAT

from .scaffold import add_commands as add_scaffold_commands
from .testcmd import add_command as add_test_command

if TYPE_CHECKING:
    from runtime.config import Config

    from .client import Client

DEFAULT_URL = os.environ.get("FNSTREAM_URL", "http://127.0.0.1:8888")  # the client commands' --url

Command = Callable[[argparse.Namespace], int]

__all__ = ("main",)


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False) if not isinstance(obj, str) else obj)


def cmd_serve(args: argparse.Namespace) -> int:
    from runtime import eventloop
    from runtime.fork_guard import become_subreaper
    from runtime.lifecycle import exit_after_shutdown
    from runtime.logs import configure_logging
    from runtime.node import build_registry

    from .app import build_app, serve
    from .keys import NODE
    from .startup import NO_FUNCTIONS_HINT, load_cli_config

    overrides = list(args.set or [])
    if args.deploy_dir:
        overrides.append(f"runtime.deployDir={Path(args.deploy_dir).resolve()}")
    if args.port is not None:
        overrides.append(f"frontend.port={args.port}")
    if args.host is not None:
        overrides.append(f"frontend.host={args.host}")
    if args.cluster:
        overrides.append(f"cluster.redisUrl={args.cluster}")
    try:
        config = load_cli_config(args.config, overrides)
        eventloop.loop_factory(config.frontend.loop)  # an unavailable loop is refused before anything starts
        if args.processes < 1:
            raise ConfigError(f"--processes {args.processes}: expected 1 or more")
        if args.processes > 1:
            if args.reload:
                raise ConfigError("--reload is for a single-process server (not with --processes)")
            return _serve_processes(args, config, overrides)
        configure_logging(config.logging.format, os.environ.get("FNSTREAM_LOG", "INFO"))
        registry = build_registry(config)
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    if len(registry) == 0 and not config.cluster.redisUrl:
        print(NO_FUNCTIONS_HINT.format(deploy=config.runtime.deployDir or Path.cwd() / "deploy"), flush=True)
    app = build_app(config, registry)
    if args.reload:
        if config.cluster.redisUrl:
            print("fnstream: --reload is for a single-process server (not with cluster.redisUrl)", file=sys.stderr)
            return 2
        from .reload import Reloader
        app.cleanup_ctx.append(Reloader(registry, config.runtime.deployDir or Path.cwd() / "deploy").context)
    become_subreaper()  # what handlers start and detach stays ours, killed at exit (runtime/fork_guard.py)
    try:
        eventloop.run(serve(app, config.frontend.host, config.frontend.port), config.frontend.loop)
    except FunctionServiceError as exc:  # e.g. the job store is in use by another server
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    return exit_after_shutdown(app[NODE].abandoned_threads)


def _serve_processes(args: argparse.Namespace, config: Config, overrides: list[str]) -> int:
    """`serve --processes N`: N frontends sharing the port (SO_REUSEPORT), cluster mode only."""
    from .supervisor import supervise

    if not config.cluster.redisUrl:
        raise ConfigError(f"--processes {args.processes} needs cluster mode (--cluster REDIS_URL or "
                          "cluster.redisUrl): in embedded mode streams, deployments and invocations live in one "
                          "process, so only one may serve them")
    if config.frontend.port == 0:
        raise ConfigError("--processes needs a fixed port (frontend.port is 0): the frontends share one port")
    cmd = [sys.executable, "-m", "frontend.cli", "serve"]
    if args.config is not None:
        cmd += ["--config", args.config]
    for override in overrides:
        cmd += ["-s", override]
    cmd += ["-s", "frontend.reusePort=true"]
    print(f"fnstream supervising {args.processes} frontends on http://{config.frontend.host}:"
          f"{config.frontend.port}", flush=True)
    fargs = config.frontend.args  # each frontend's SIGTERM-to-exit, and room to spare
    return supervise(cmd, args.processes, fargs.shutdownGraceSeconds + fargs.preStopGraceSeconds + 10)


def cmd_worker(args: argparse.Namespace) -> int:
    """A handler-only cluster node: functions come from the shared registry, work from the queue."""
    from runtime import eventloop
    from runtime.fork_guard import become_subreaper
    from runtime.lifecycle import exit_after_shutdown
    from runtime.logs import configure_logging
    from runtime.node import serve_worker

    from .startup import load_cli_config

    overrides = [*(args.set or []), f"cluster.redisUrl={args.cluster}"]
    if args.concurrency is not None:
        overrides.append(f"cluster.workerConcurrency={args.concurrency}")
    try:
        config = load_cli_config(args.config, overrides)
        eventloop.loop_factory(config.frontend.loop)
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    configure_logging(config.logging.format, os.environ.get("FNSTREAM_LOG", "INFO"))
    become_subreaper()
    return exit_after_shutdown(eventloop.run(serve_worker(config), config.frontend.loop))


def _client(args: argparse.Namespace) -> Client:
    from .client import Client
    return Client(args.url, args.token)


def _report(status: int, body: Any) -> int:
    _print(body)
    return 0 if status < 400 else 1


def cmd_deploy(args: argparse.Namespace) -> int:
    """Every function of every file in one request: all are deployed (or redeployed), or none."""
    from runtime.manifest import load_manifest_file
    functions: list[dict[str, Any]] = []
    try:
        for file in args.files:
            # What the file set, not every default: the server then knows what was asked for
            # (it warns about an unenforced `memory` only when the manifest set one).
            functions.extend(s.model_dump(mode="json", exclude_unset=True) for s in load_manifest_file(Path(file)))
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    status, body = asyncio.run(_client(args).call("PUT", "/admin/v1/functions", json_body=functions))
    if status >= 400 or args.json or not isinstance(body, dict):
        return _report(status, body)
    for fn in body["functions"]:  # one line a function: name, URN, executor, revision or its init error
        st = fn["status"]
        state = f"init failed: {st['initError']}" if st.get("initError") else f"revision {st['revision']}"
        print(f"{fn['name']:<20} {fn['urn']:<60} {st['executor']:<8} {state}")
    return 0


def cmd_functions(args: argparse.Namespace) -> int:
    status, body = asyncio.run(_client(args).call("GET", "/admin/v1/functions"))
    if status >= 400 or args.json:
        return _report(status, body)
    for fn in body["functions"]:
        print(f"{fn['name']:<20} {fn['urn']:<60} {fn['status']['kind']:<9} inflight={fn['status']['inflight']}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    return _report(*asyncio.run(_client(args).call("DELETE", f"/admin/v1/functions/{args.name}")))


def cmd_invoke(args: argparse.Namespace) -> int:
    try:
        event = json.loads(args.data)
    except ValueError as exc:
        print(f"fnstream: --data is not JSON: {exc}", file=sys.stderr)
        return 2
    client = _client(args)
    path = f"/serverless/v1/functions/{args.name}/invocations"
    if args.async_:
        job_id = _submit_job(client, path, event, sys.stderr if args.follow else sys.stdout)
        if job_id is None or not args.follow:
            return 0 if job_id is not None else 1
        return _follow_job(client, job_id, None)
    if args.follow:
        print("fnstream: --follow is for --async (a job's output); use --stream to read an invocation's events",
              file=sys.stderr)
        return 2
    if not args.stream:
        return _report(*asyncio.run(client.call("POST", path, json_body=event)))

    from .client import iter_sse
    from .progress import LiveStatus

    async def run() -> int:
        async with client.session() as s:
            async with s.post(client.url + path, json=event, headers={"Accept": "text/event-stream"}) as r:
                if r.content_type != "text/event-stream":
                    return _report(r.status, await r.text())
                async with LiveStatus(args.name) as status:
                    async for ev in iter_sse(r):
                        status.print(ev["data"])
                return 0 if r.status < 400 else 1

    return asyncio.run(run())


def _submit_job(client: Client, path: str, event: object, out: TextIO) -> str | None:
    """`invoke --async`: print the job id (a request id of openYuanrong's async invocation) to `out`
    (stderr with --follow: stdout is the output's) and return it; None (the answer printed) when the
    job was not accepted."""
    status, body = asyncio.run(client.call("POST", path, json_body=event, headers={"X-Invoke-Type": "async"}))
    if status != 202 or not isinstance(body, dict):
        _report(status, body)
        return None
    print(body["requestId"], file=out, flush=True)
    return str(body["requestId"])


def cmd_job(args: argparse.Namespace) -> int:
    """Show a job; with --follow print its output items as they arrive, then exit 0 if it completed."""
    client = _client(args)
    if not args.follow:
        status, body = asyncio.run(client.call("GET", _job_path(args.id)))
        return _report(status, body)
    return _follow_job(client, args.id, args.from_id)


def _job_path(job_id: str) -> str:
    return f"/serverless/v1/jobs/{urllib.parse.quote(job_id, safe='')}"


def _follow_job(client: Client, job_id: str, from_id: int | None) -> int:
    """Print a job's output items as they arrive; 0 once it completed."""
    from .client import iter_sse
    path = _job_path(job_id)

    async def run() -> int:
        headers = {"Accept": "text/event-stream"}
        if from_id is not None:
            headers["Last-Event-ID"] = str(from_id)
        async with client.session() as s:
            async with s.get(client.url + path + "/events", headers=headers) as r:
                if r.content_type != "text/event-stream":
                    return _report(r.status, await r.text())
                async for ev in iter_sse(r):
                    if ev["data"] != "[DONE]":
                        print(ev["data"], flush=True)
        status, body = await client.call("GET", path)
        if status >= 400 or not isinstance(body, dict):
            return _report(status, body)
        print(f"fnstream: job {job_id} {body['status']}", file=sys.stderr)
        return 0 if body["status"] == "COMPLETED" else 1

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130


def cmd_subscribe(args: argparse.Namespace) -> int:
    """Print a named stream's elements as they arrive; the server ends the response on the terminator."""
    client = _client(args)
    headers = {"X-Stream-Name": args.name, "Accept": "text/event-stream"}
    for header, value in (("Last-Event-ID", args.from_id), ("X-Timeout-Ms", args.timeout_ms),
                          ("X-Expect-Num", args.expect_num), ("X-Stream-Terminator", args.terminator)):
        if value is not None:
            headers[header] = str(value)
    from .client import iter_sse
    from .progress import LiveStatus

    async def run() -> int:
        rc = 0
        async with client.session() as s:
            async with s.get(client.url + "/serverless/v1/stream/subscribe", headers=headers) as r:
                if r.content_type != "text/event-stream":
                    return _report(r.status, await r.text())
                async with LiveStatus(args.name) as status:
                    async for ev in iter_sse(r):
                        if ev["event"] == "binary":
                            status.write_bytes(base64.b64decode(ev["data"]) + b"\n")
                        elif ev["event"] in ("error", "end"):
                            status.note(f"fnstream: {ev['event']}: {ev['data']}")
                            rc = 1 if ev["event"] == "error" and '"lost_from_id"' not in ev["data"] else rc
                        else:
                            status.print(ev["data"])
        return rc

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130


def cmd_publish(args: argparse.Namespace) -> int:
    path = "/serverless/v1/streams/" + urllib.parse.quote(args.name, safe="")
    return _report(*asyncio.run(_client(args).call("POST", path, json_body=list(args.elements))))


CONFIG_HELP = "config YAML (default: ./config/default.yaml if present, else the built-in defaults)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fnstream", description="Python function-service runtime for streaming work")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server with the deploy directory's functions")
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("-s", "--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    serve.add_argument("--deploy-dir", help="manifest directory (overrides runtime.deployDir)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--cluster", metavar="REDIS_URL", help="cluster mode: share registry, queue and streams "
                       "through Redis (sets cluster.redisUrl)")
    serve.add_argument("--processes", type=int, default=1, metavar="N", help="cluster mode: run N frontends "
                       "sharing the port (SO_REUSEPORT), restarted when one dies (default 1)")
    serve.add_argument("--reload", action="store_true", help="redeploy a function when its manifest in the deploy "
                       "directory or a .py file under its codePath changes (development)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a handler-only cluster node taking queued invocations")
    worker.add_argument("--cluster", required=True, metavar="REDIS_URL", help="redis://HOST:PORT/DB")
    worker.add_argument("--config", help=CONFIG_HELP)
    worker.add_argument("-s", "--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    worker.add_argument("--concurrency", type=int, help="invocations run at once (cluster.workerConcurrency)")
    worker.set_defaults(func=cmd_worker)

    def client_command(name: str, help: str, func: Command) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--url", default=DEFAULT_URL, help="server URL (env FNSTREAM_URL; default %(default)s)")
        p.add_argument("--token", default=os.environ.get("FNSTREAM_TOKEN"), help="bearer token (env FNSTREAM_TOKEN)")
        p.set_defaults(func=func)
        return p

    p = client_command("deploy", "deploy or redeploy manifests on a running server", cmd_deploy)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print the server's whole answer")
    client_command("functions", "list deployed functions", cmd_functions).add_argument("--json", action="store_true")
    client_command("delete", "delete a function", cmd_delete).add_argument("name")
    p = client_command("invoke", "invoke a function", cmd_invoke)
    p.add_argument("name")
    p.add_argument("--data", default="{}", help="JSON event (default {})")
    p.add_argument("--stream", action="store_true", help="ask for Server-Sent Events and print them as they arrive")
    p.add_argument("--async", dest="async_", action="store_true",
                   help="run it as a background job (X-Invoke-Type: async) and print the job id")
    p.add_argument("--follow", "-f", action="store_true", help="with --async: then print the job's output items "
                   "as they arrive, until it ends")
    p = client_command("job", "show a job (fnstream invoke --async, RunPod /run), or follow its output", cmd_job)
    p.add_argument("id")
    p.add_argument("--follow", "-f", action="store_true", help="print each output item as it arrives, until the end")
    p.add_argument("--from-id", type=int, help="with --follow: resume after this item")
    p = client_command("subscribe", "print a named stream's elements as they arrive, until its terminator",
                       cmd_subscribe)
    p.add_argument("name")
    p.add_argument("--from-id", type=int, help="resume after this element id (replays what is retained)")
    p.add_argument("--timeout-ms", type=int, help="end after this long without an element (0: never)")
    p.add_argument("--expect-num", type=int, help="end after this many elements")
    p.add_argument("--terminator", help="the element that ends the stream (default: the server's)")
    p = client_command("publish", "publish elements (UTF-8 text each) into a named stream", cmd_publish)
    p.add_argument("name")
    p.add_argument("elements", nargs="+", metavar="ELEMENT")
    add_scaffold_commands(sub)
    add_test_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("FNSTREAM_LOG", "INFO"), format=TEXT_FORMAT)
    args = build_parser().parse_args(argv)
    command: Command = args.func
    if not hasattr(args, "url"):
        return command(args)
    try:
        return command(args)
    except OSError as exc:  # the client commands: no server there, refused, reset (aiohttp's are OSErrors)
        print(f"fnstream: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
