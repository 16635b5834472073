"""The `fnstream` command: serve, deploy, functions, delete, invoke."""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import sys
import urllib.parse
from pathlib import Path

from runtime.config import DEFAULT_CONFIG_PATH, load_config
from runtime.errors import FunctionServiceError
from runtime.manifest import load_manifest_file

from .client import DEFAULT_URL, Client, iter_sse

__all__ = ("main",)


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False) if not isinstance(obj, str) else obj)


def cmd_serve(args: argparse.Namespace) -> int:
    from .app import build_app, build_registry, serve
    from .keys import EXECUTOR

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
        config = load_config(args.config, overrides)
        registry = build_registry(config)
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    app = build_app(config, registry)
    asyncio.run(serve(app, config.frontend.host, config.frontend.port))
    return exit_after_serve(app[EXECUTOR].abandoned_threads())


def exit_after_serve(abandoned: int) -> int:
    """0 after a clean stop. Handler threads that would not stop cannot be joined (the interpreter
    would wait for them for ever at exit): say so, and leave at once with status 1."""
    if not abandoned:
        return 0
    logging.getLogger("fnstream.frontend").error(
        "exiting with %d handler thread(s) still running: they were abandoned (a thread cannot be "
        "stopped; use 'executor: process' for code that must be stoppable)", abandoned)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def cmd_worker(args: argparse.Namespace) -> int:
    """A handler-only cluster node: functions come from the shared registry, work from the queue."""
    from runtime.cluster.node import serve_worker

    overrides = list(args.set or []) + [f"cluster.redisUrl={args.cluster}"]
    if args.concurrency is not None:
        overrides.append(f"cluster.workerConcurrency={args.concurrency}")
    try:
        config = load_config(args.config, overrides)
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    asyncio.run(serve_worker(config))
    return 0


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.token)


def _report(status: int, body) -> int:
    _print(body)
    return 0 if status < 400 else 1


def cmd_deploy(args: argparse.Namespace) -> int:
    functions = []
    try:
        for file in args.files:
            functions.extend(s.model_dump(mode="json") for s in load_manifest_file(Path(file)))
    except FunctionServiceError as exc:
        print(f"fnstream: {exc.message}", file=sys.stderr)
        return 2
    client = _client(args)

    async def run() -> int:
        rc = 0
        for fn in functions:
            status, body = await client.call("POST", "/admin/v1/functions", json_body=fn)
            if status == 409:
                status, body = await client.call("PUT", f"/admin/v1/functions/{fn['name']}", json_body=fn)
            rc |= _report(status, body)
        return rc

    return asyncio.run(run())


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
    if not args.stream:
        return _report(*asyncio.run(client.call("POST", path, json_body=event)))

    async def run() -> int:
        async with client.session() as s:
            async with s.post(client.url + path, json=event, headers={"Accept": "text/event-stream"}) as r:
                if r.content_type != "text/event-stream":
                    return _report(r.status, await r.text())
                async for ev in iter_sse(r):
                    print(ev["data"], flush=True)
                return 0 if r.status < 400 else 1

    return asyncio.run(run())


def cmd_subscribe(args: argparse.Namespace) -> int:
    """Print a named stream's elements as they arrive; the server ends the response on the terminator."""
    client = _client(args)
    headers = {"X-Stream-Name": args.name, "Accept": "text/event-stream"}
    for header, value in (("Last-Event-ID", args.from_id), ("X-Timeout-Ms", args.timeout_ms),
                          ("X-Expect-Num", args.expect_num), ("X-Stream-Terminator", args.terminator)):
        if value is not None:
            headers[header] = str(value)

    async def run() -> int:
        rc = 0
        async with client.session() as s:
            async with s.get(client.url + "/serverless/v1/stream/subscribe", headers=headers) as r:
                if r.content_type != "text/event-stream":
                    return _report(r.status, await r.text())
                async for ev in iter_sse(r):
                    if ev["event"] == "binary":
                        sys.stdout.buffer.write(base64.b64decode(ev["data"]) + b"\n")
                        sys.stdout.flush()
                    elif ev["event"] in ("error", "end"):
                        print(f"fnstream: {ev['event']}: {ev['data']}", file=sys.stderr, flush=True)
                        rc = 1 if ev["event"] == "error" and '"lost_from_id"' not in ev["data"] else rc
                    else:
                        print(ev["data"], flush=True)
        return rc

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130


def cmd_publish(args: argparse.Namespace) -> int:
    path = "/serverless/v1/streams/" + urllib.parse.quote(args.name, safe="")
    return _report(*asyncio.run(_client(args).call("POST", path, json_body=list(args.elements))))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fnstream", description="Python function-service runtime for streaming work")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server with the deploy directory's functions")
    serve.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="config YAML (default: %(default)s)")
    serve.add_argument("-s", "--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    serve.add_argument("--deploy-dir", help="manifest directory (overrides runtime.deployDir)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--cluster", metavar="REDIS_URL", help="cluster mode: share registry, queue and streams "
                       "through Redis (sets cluster.redisUrl)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a handler-only cluster node taking queued invocations")
    worker.add_argument("--cluster", required=True, metavar="REDIS_URL", help="redis://HOST:PORT/DB")
    worker.add_argument("--config", default=str(DEFAULT_CONFIG_PATH), help="config YAML (default: %(default)s)")
    worker.add_argument("-s", "--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    worker.add_argument("--concurrency", type=int, help="invocations run at once (cluster.workerConcurrency)")
    worker.set_defaults(func=cmd_worker)

    def client_command(name: str, help: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--url", default=DEFAULT_URL, help="server URL (env FNSTREAM_URL; default %(default)s)")
        p.add_argument("--token", default=os.environ.get("FNSTREAM_TOKEN"), help="bearer token (env FNSTREAM_TOKEN)")
        p.set_defaults(func=func)
        return p

    client_command("deploy", "deploy or redeploy manifests on a running server", cmd_deploy).add_argument(
        "files", nargs="+", metavar="FILE")
    client_command("functions", "list deployed functions", cmd_functions).add_argument("--json", action="store_true")
    client_command("delete", "delete a function", cmd_delete).add_argument("name")
    p = client_command("invoke", "invoke a function", cmd_invoke)
    p.add_argument("name")
    p.add_argument("--data", default="{}", help="JSON event (default {})")
    p.add_argument("--stream", action="store_true", help="ask for Server-Sent Events and print them as they arrive")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("FNSTREAM_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
