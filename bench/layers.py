"""What each layer of fnstream's invoke path costs: `python -m bench.layers`.

A profile says where time goes; this says what removing a layer would give back. Each variant is
a full fnstream server (`bench/config.yaml`) with one or more layers taken out by patching the
process before it starts (a measurement device, never a configuration), measured beside the
unpatched server and the ceiling (bare aiohttp on uvloop) in one run: server CPU µs per JSON invoke
of `bench-echo-async` (bench/cpu.py's method) and, with `--memory`, KB per idle open stream
(bench/scenarios.py's; not for `runtime` and `route`, whose route no longer streams). Layers:

- `frontdoor`: the listener's fast lane (frontend/front_door.py): every request, plain JSON
  invokes included, goes through the app (router, middlewares, route)
- `middleware`: the app without middlewares (JSON errors, CORS, trace headers, and the wrapper
  aiohttp adds to every request once an app has any middleware); the fast lane never had them
- `limits`: the listener's header/body/keep-alive hooks (frontend/server.py) replaced by aiohttp's own
- `logcontext`: no log context set per request and per invocation (runtime/logs.py)
- `counted`: no counting of each invocation (the fast lane's metrics record; on the app path the
  wrapper counting it and cancelling it when its client leaves, `@invocation_route`)
- `runtime`: the invoke code calls the handler itself: no dispatch, Invocation, executor, answer()
- `route`: the invoke code is the ceiling's echo (parse, dump) inside fnstream's app and server
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from .client import Target
from .cpu import measure_cpu
from .scenarios import idle_memory
from .servers import BENCH, ServerProc, cpu_plan, free_port, pin_self

__all__ = ("main",)

LAYERS = ("frontdoor", "middleware", "limits", "logcontext", "counted", "runtime", "route")
_ECHO = "/serverless/v1/functions/bench-echo-async/invocations"
_STREAM = "/serverless/v1/functions/bench-stream/invocations"


def _patch(layers: set[str]) -> None:
    """Take `layers` out of this process's fnstream (before the app is built)."""
    from aiohttp import web
    from aiohttp.web_protocol import RequestHandler

    if "counted" in layers:  # before the routes are imported: @invocation_route is applied at import
        import frontend.respond
        frontend.respond.invocation_route = lambda route: route  # type: ignore[assignment]
    import frontend.app
    import frontend.routes.invoke as invoke
    import frontend.server
    import frontend.tracing
    import runtime.executor
    from frontend.body import parse_json_body, read_body

    if "frontdoor" in layers:
        frontend.server.FrontDoor = lambda app, app_handler, *args: app_handler  # type: ignore[assignment,misc]
    if "counted" in layers:
        invoke.METRICS = web.AppKey("no_metrics", object)  # type: ignore[misc]  # the invoke finds no stats
    if "middleware" in layers:
        build = web.Application

        def bare_app(*args: Any, middlewares: Any = (), **kwargs: Any) -> web.Application:
            return build(*args, **kwargs)
        frontend.app.web = type(sys)("web_without_middlewares")  # type: ignore[assignment]
        frontend.app.web.__dict__.update(web.__dict__)
        frontend.app.web.Application = bare_app  # type: ignore[attr-defined]
    if "limits" in layers:
        for name in ("data_received", "connection_made", "connection_lost"):
            setattr(frontend.server._LimitedHandler, name, getattr(RequestHandler, name))
    if "logcontext" in layers:
        runtime.executor.set_log_context = frontend.tracing.set_log_context = lambda *a: None  # type: ignore
    if "runtime" in layers:
        async def call_handler(invoker: Any, request: web.BaseRequest, ref: str) -> web.StreamResponse:
            function = invoker._dispatcher.find(None, ref)
            event = parse_json_body(await read_body(request, invoker._body_limit))
            result = await function.code.handler(event, None)
            return web.Response(body=json.dumps(result, separators=(",", ":")).encode(),
                                content_type="application/json")
        _replace_invoke(invoke, call_handler)
    if "route" in layers:
        async def echo(invoker: Any, request: web.BaseRequest, ref: str) -> web.StreamResponse:
            body = await request.json()
            return web.Response(text=json.dumps(body, separators=(",", ":")), content_type="application/json")
        _replace_invoke(invoke, echo)


def _replace_invoke(invoke: Any, handler: Any) -> None:
    """Both doors call `Invoker.serve` (frontend/routes/invoke.py): it becomes `handler(invoker, request, ref)`."""
    invoke.Invoker.serve = lambda self, request, ref, *rest: handler(self, request, ref)


def _serve(layers: str, argv: list[str]) -> int:
    _patch(set(filter(None, layers.split(","))))
    from frontend.cli import main as cli
    return cli(argv)


async def _measure(variants: list[str], trials: int, requests: int, memory: bool) -> dict[str, dict[str, float]]:
    server_cores, client_cores = cpu_plan()
    pin_self(client_cores)
    logs = Path(tempfile.mkdtemp(prefix="bench-layers-"))
    servers: dict[str, ServerProc] = {}
    targets: dict[str, Target] = {}
    env = {"FNSTREAM_LOG": "WARNING"}
    try:
        for v in variants:
            port = free_port()
            if v == "ceiling":
                cmd, health, echo, stream = [sys.executable, "-m", "bench.targets.bare_aiohttp", str(port)], None, \
                    "/echo", "/stream"
            else:
                cmd = [sys.executable, "-m", "bench.layers", "--serve", "" if v == "fnstream" else v, "serve",
                       "--config", str(BENCH / "config.yaml"), "--port", str(port)]
                health, echo, stream = "/healthz", _ECHO, _STREAM
            servers[v] = ServerProc(v, cmd, port, logs / f"{v}.log", server_cores, env, health)
            targets[v] = Target(v, "127.0.0.1", port, stream, echo)
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        for trial in range(trials):
            for v in variants[trial % len(variants):] + variants[:trial % len(variants)]:
                res = await measure_cpu(targets[v], servers[v], requests, 64)
                if res["errors"]:
                    raise RuntimeError(f"{v}: {res['errors']} errors; see {logs}")
                cpu[v].append(res["us_per_request"])
        out = {v: {"us": statistics.median(cpu[v])} for v in variants}
        if memory:  # (not of a variant whose invoke route no longer streams)
            for v in variants:
                if not {"runtime", "route"} & set(v.split(",")):
                    out[v]["kb"] = (await idle_memory(targets[v], servers[v], 1.0))["value"]
        return out
    finally:
        for s in servers.values():
            s.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.layers", description=__doc__.split("\n")[0])
    p.add_argument("--variants", nargs="*", default=["frontdoor", "limits", "logcontext", "counted", "runtime",
                                                     "route", "limits,route"],
                   help=f"comma-joined subsets of {list(LAYERS)} to take out")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--memory", action="store_true", help="also KB per idle open stream (1000 held)")
    p.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run a server without these layers
    args, rest = p.parse_known_args(argv)
    if args.serve is not None:
        return _serve(args.serve, rest)
    unknown = {layer for v in args.variants for layer in v.split(",")} - set(LAYERS)
    if unknown:
        p.error(f"unknown layers {sorted(unknown)}; choose from {list(LAYERS)}")
    variants = ["ceiling", "fnstream", *args.variants]
    out = asyncio.run(_measure(variants, args.trials, args.requests, args.memory))
    full = out["fnstream"]
    print(f"\nserver CPU µs per JSON invoke (median of {args.trials} × {args.requests}), ceiling = bare aiohttp:")
    print("| server | CPU µs/request | ratio to ceiling | µs given back |" + (" KB/idle stream | KB given back |"
                                                                             if args.memory else ""))
    print("|---|---|---|---|" + ("---|---|" if args.memory else ""))
    for v in variants:
        row = out[v]
        name = v if v in ("ceiling", "fnstream") else f"fnstream without {v.replace(',', ' + ')}"
        base = v in ("ceiling", "fnstream")
        back = "—" if base else f"{full['us'] - row['us']:.1f}"
        line = f"| {name} | {row['us']:.1f} | {out['ceiling']['us'] / row['us']:.2f}× | {back} |"
        if args.memory:
            if "kb" in row:
                back = "—" if base else f"{full['kb'] - row['kb']:.1f}"
                line += f" {row['kb']:.1f} | {back} |"
            else:
                line += " — | — |"
        print(line)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FNSTREAM_LOG", "WARNING")
    sys.exit(main())
