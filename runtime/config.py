"""fnstream configuration: pydantic models, loaded from a YAML file plus `-s key=value` overrides.

Unknown keys and wrong types are refused at start, and the message names the key, the file and
what was expected. Relative paths are resolved against the directory of the config file, except
`jobs.path`, which is inside the data directory (`runtime.dataDir`, `.fnstream` in the cwd by default).
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config_jobs import JobsConfig, WebhookConfig
from .errors import ConfigError

__all__ = ("Config", "FrontendConfig", "FrontendArgs", "FrontendLimits", "RuntimeConfig", "AuthConfig",
           "AuthToken", "StreamsConfig", "OpenAIConfig", "ClusterConfig", "CorsConfig", "MetricsConfig",
           "LoggingConfig", "TenantsConfig", "JobsConfig", "WebhookConfig", "load_config", "DEFAULT_CONFIG_PATH",
           "packaged_default_config")

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "config" / "default.yaml"


def packaged_default_config() -> Path:
    """The shipped default.yaml: the checkout's config/ or, installed, the wheel's copy of it.

    setup.py maps config/ to the `runtime._defaults` package, so an installed fnstream carries the
    same file; a bare checkout (no install) has only the top-level directory.
    """
    try:
        from importlib.resources import files
        embedded = Path(str(files("runtime._defaults") / "default.yaml"))
    except (ModuleNotFoundError, TypeError):
        return DEFAULT_CONFIG_PATH
    return embedded if embedded.is_file() else DEFAULT_CONFIG_PATH


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FrontendArgs(_Strict):
    enableEvent: bool = Field(False,
                              description="SSE on invoke when `Accept` admits `text/event-stream`; false (as in "
                                          "openYuanrong) answers JSON only")
    maxRequestBodySize: float = Field(6, gt=0, description="MB of a request body, counted decompressed; 413 beyond")
    maxBodyValues: int = Field(100_000, ge=1, description="values in one JSON or msgpack request body: arrays, "
                                                          "objects and every element and member (JSON: counted as "
                                                          "its `,` `[` `{` outside strings); 413 beyond, before it "
                                                          "is parsed (each value costs the event loop time)")
    heartbeatSeconds: float = Field(15, gt=0,
                                    description="`: ping` comment after this long without an event (up to 1.25× "
                                                "this on invoke and OpenAI streams: one clock per process beats "
                                                "for every open stream)")
    streamBufferEvents: int = Field(100, ge=1, description="per-invocation output buffer (events); a writer blocks "
                                                           "or waits while it is full")
    streamBufferBytes: int = Field(4 * 1024 * 1024, ge=1, description="per-invocation output buffer in bytes "
                                                                      "(UTF-8), besides `streamBufferEvents`; one "
                                                                      "larger write still passes alone")
    maxWriteSize: int = Field(4 * 1024 * 1024, ge=1, description="bytes per stream write (`StreamWriteError` "
                                                                 "beyond)")
    maxResponseSize: int = Field(6 * 1024 * 1024, ge=1, description="bytes of a JSON result (500, code 4004, "
                                                                    "beyond)")
    shutdownGraceSeconds: float = Field(10, ge=0, description="on SIGTERM/SIGINT, in-flight invocations may finish "
                                                              "this long; the rest end with a 200503 error event "
                                                              "and `[DONE]`; also how long a redeployed function's "
                                                              "old revision may finish its invocations before its "
                                                              "`preStop`")
    preStopGraceSeconds: float = Field(10, ge=0, description="how long `preStop` hooks may run, on top of "
                                                             "`shutdownGraceSeconds` (not out of it): at "
                                                             "shutdown once the invocations are drained, and "
                                                             "for a redeployed function's old revision once its "
                                                             "invocations are over; each gets min(its `timeout`, "
                                                             "180 s, this), a worker process still running after "
                                                             "it is killed")


class FrontendLimits(_Strict):
    """Connection limits of the listener (frontend/server.py); every key is documented in docs/configuration.md."""

    keepAliveSeconds: float = Field(75, gt=0, description="an idle keep-alive connection is closed after this "
                                                          "(above the 60 s idle timeout of common load balancers, "
                                                          "so they close first)")
    headerTimeoutSeconds: float = Field(10, gt=0, description="a request's line and headers must arrive within "
                                                              "this, from connect or from the first byte of the "
                                                              "next request on a kept-alive connection; a "
                                                              "slowloris client gets 408 and is closed")
    bodyTimeoutSeconds: float = Field(60, gt=0, description="a request body must arrive within this once its "
                                                            "headers did (408, code 408000, then closed); never "
                                                            "applies to the response (SSE runs as long as it "
                                                            "needs)")
    sendTimeoutSeconds: float = Field(60, gt=0, description="a response the client takes none of for this long "
                                                            "(its socket full) is aborted and its invocation "
                                                            "cancelled; a slow reader that keeps taking bytes is "
                                                            "not")
    maxHeaderFieldSize: int = Field(8190, ge=256, description="bytes of the URL, and of each header's name and of "
                                                              "its value; 431 beyond")
    maxHeaders: int = Field(128, ge=1, description="header lines per request; 431 beyond")
    maxHeaderBytes: int = Field(64 * 1024, ge=1024, description="bytes of one request's line and headers while "
                                "they arrive; past it 431")
    maxHeaderBytesInFlight: int = Field(64 * 1024 * 1024, ge=1024, description="bytes of unfinished request "
                                        "heads held across all connections; past it the connection adding "
                                        "more gets 503")
    maxConnections: int = Field(10000, ge=1, description="open connections of one frontend process; past it a new "
                                                         "one gets 503 with `Retry-After: 1` and is closed")
class CorsConfig(_Strict):
    """Cross-origin access for browser pages on other origins (frontend/cors.py)."""

    allowOrigins: list[str] = Field(default_factory=list, description="origins allowed to call from a browser (`*` "
                                                                      "= any); empty = CORS off")
    allowCredentials: bool = Field(False,
                                   description="send `Access-Control-Allow-Credentials: true`; with `*` or "
                                               "`null` in `allowOrigins` a config error at start (any origin, or "
                                               "any sandboxed page, with credentials)")
    maxAgeSeconds: int = Field(600, ge=0, description="how long a browser may cache a preflight answer (seconds)")
    exposeHeaders: list[str] = Field(default_factory=lambda: ["X-Trace-Id", "X-Inner-Code", "X-Billing-Duration"],
                                     description="headers a page may read (`X-Request-Id` and `traceparent` are "
                                                 "always added)")


class FrontendConfig(_Strict):
    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(8888, ge=0, le=65535, description="listen port (0 = any free port)")
    backlog: int = Field(2048, ge=1, le=2**31 - 1,  # listen() takes a C int; the kernel caps it at somaxconn
                         description="listen backlog: connections the kernel queues before the server accepts them "
                                     "(capped by `net.core.somaxconn`)")
    loop: Literal["auto", "asyncio", "uvloop"] = Field("auto",
                                                       description="event loop of `serve` and `worker`: `auto` = "
                                                                   "uvloop when importable, else asyncio's; "
                                                                   "`uvloop` is refused at start when it is not "
                                                                   "installed")
    reusePort: bool = Field(False, description="SO_REUSEPORT: several cluster-mode frontends share one port (set "
                                               "by `serve --processes`); refused without `cluster.redisUrl`")
    limits: FrontendLimits = Field(FrontendLimits(), description="connection limits of the listener")
    args: FrontendArgs = Field(FrontendArgs(), description="invocation settings (openYuanrong's `frontend.args`)")
    cors: CorsConfig = Field(CorsConfig(), description="cross-origin access for browser pages on other origins")
    allowedHosts: list[str] | None = Field(None, description="`Host` values served; any other gets 421 (a "
                                                             "DNS-rebinding page names its own host). Unset: "
                                                             "`localhost`, `frontend.host` and any IP-address "
                                                             "literal; bound to a wildcard (`0.0.0.0`, `::`) any "
                                                             "Host when auth is on, else only those. `['*']` = no "
                                                             "check. Both the fast lane and the app path check it")
    trustedProxies: list[str] = Field(default_factory=list,
                                      description="peer addresses/CIDRs whose `X-Forwarded-Host` is believed (for "
                                                  "the Host and Origin checks); from anyone else it is ignored")


class RuntimeConfig(_Strict):
    threadPoolSize: int = Field(64, ge=1, description="threads for plain `def` handlers")
    threadsPerFunction: int | None = Field(None, ge=1, description="threads one function may hold, counting "
                                                                   "threads still running past their timeout (see "
                                                                   "Hardening); unset = a quarter of "
                                                                   "`threadPoolSize`")
    threadsPerTenant: int | None = Field(None, ge=1, description="threads one tenant's functions may hold "
                                         "together (counting threads past their timeout): a tenant flooding "
                                         "slow `def` handlers leaves the rest of the pool to the others, and "
                                         "threads that free go to waiting tenants in turn; unset = half of "
                                         "`threadPoolSize` (set it to `threadPoolSize` on a one-tenant node)")
    cpuBoundThreadsPerFunction: int = Field(2, ge=1, description="threads of one function found busy on a "
                                            "CPU at once; while that many are, its next calls wait (Python "
                                            "threads share one GIL; raise it for native code that releases it)")
    burningSwitchInterval: float = Field(0.0002, gt=0, le=0.1, description="sys.setswitchinterval while "
                                         "`def` threads burn CPU: how long one holds the GIL while the loop "
                                         "waits (otherwise Python's 0.005 stays: cheaper hand-offs)")
    codeRoots: list[Path] = Field(default_factory=list, description="handler code must live under one of these "
                                                                    "(empty: anywhere)")
    deployDir: Path | None = Field(None, description="manifests deployed at start; unset = none")
    maxWorkerProcesses: int | None = Field(64, ge=1, description="worker processes the process functions "
                                           "of this node may hold (max(minInstances, 1) each, summed; a "
                                           "deploy past it, or past what the others run, is a 429) and run at "
                                           "all, starting ones included: no worker starts past it; a function "
                                           "at it waits for a slot (null: no limit)")
    dataDir: Path | None = Field(None, description="where the server keeps what must outlive a restart: the "
                                 "SQLite job store (`jobs.path`), which also holds the functions deployed "
                                 "through the admin API. Unset = `.fnstream` in the directory the server "
                                 "runs in; created when first needed")


class TenantsConfig(_Strict):
    maxFunctions: int | None = Field(1000, ge=1, description="functions one tenant may have deployed; "
                                     "a deploy past it is a 429 (null: no limit)")
    maxInstancesPerFunction: int | None = Field(32, ge=1, le=256, description="the most `instances`, "
                                                "`minInstances` or `maxInstances` one function may ask; "
                                                "more is a 400 at deploy (null: the manifest's own 256)")


class AuthToken(_Strict):
    """A token, the tenant it belongs to and its role: `user` invokes, `developer` also manages its
    tenant's functions and streams, `admin` manages every tenant's (runtime/principal.py)."""

    token: str = Field(min_length=1, pattern=r"^\S+$", description="the bearer token; no whitespace: tokens are "
                                                                   "matched exactly")
    tenant: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$",
                        description="the tenant the token belongs to")
    role: Literal["user", "developer", "admin"] = Field("user",
                                                        description="`user` invokes; `developer` also manages its "
                                                                    "tenant's functions and streams; `admin` "
                                                                    "manages every tenant's")


class AuthConfig(_Strict):
    tokens: list[AuthToken] = Field(default_factory=list, description="`[{token, tenant, role}]`; empty = auth off")


class StreamsConfig(_Strict):
    """Named-stream settings (see runtime/streams; every key is documented in docs/configuration.md)."""

    subscriberBuffer: int = Field(1000, ge=1, description="elements buffered per subscription")
    subscriberBufferBytes: int = Field(4 * 1024 * 1024, ge=1,
                                       description="bytes buffered per subscription (memory broker), or kept for "
                                                   "slow subscribers beyond `retainNum` and returned per read "
                                                   "(Redis broker); one larger element still passes alone")
    slowConsumerPolicy: Literal["block", "cut"] = Field("cut",
                                                        description="`block` the producer or `cut` the slow "
                                                                    "subscriber (`block` is refused in cluster "
                                                                    "mode)")
    blockTimeoutMs: int = Field(5000, ge=0, description="how long `block` makes a producer wait")
    retainNum: int = Field(0, ge=0, description="default retention per stream, in elements (0 = none)")
    retainBytes: int = Field(0, ge=0, description="default retention per stream, in bytes (0 = none)")
    retainSeconds: float = Field(0, ge=0, description="default retention per stream, in seconds (0 = none)")
    maxStreamSize: int = Field(64 * 1024 * 1024, ge=1, description="cap on retained bytes per stream")
    subscribeTimeoutMs: int = Field(0, ge=0, description="default idle timeout of a REST subscription (0 = none)")
    terminators: list[str] = Field(default_factory=lambda: ["[DONE]", "\\xE0\\xFF\\xE0\\xFF"],
                                   description="elements that end a REST subscription; the second is "
                                               "openYuanrong's end marker written with `\\xHH` escapes, which "
                                               "matches both its 16-character text and the 4 raw bytes")
    maxElementSize: int = Field(4 * 1024 * 1024, ge=1, description="bytes per element (413 beyond)")
    maxElementsPerPublish: int = Field(10000, ge=1, description="elements in one `POST "
                                                                "/serverless/v1/streams/{name}` (413 beyond, "
                                                                "nothing published: each element costs the event "
                                                                "loop time); a handler's producer flushes at this "
                                                                "many")
    maxStreams: int = Field(10000, ge=1,
                            description="named streams known at once; 429 beyond (idle streams are forgotten "
                                        "first)")
    maxStreamsPerTenant: int = Field(5000, ge=1,
                                     description="named streams of one tenant at once (embedded mode); 429 "
                                                 "beyond, so one tenant cannot fill `maxStreams` for the "
                                                 "others (for a guarantee among N tenants, set it to "
                                                 "`maxStreams / N`)")
    maxSubscribersPerStream: int = Field(10000, ge=1, description="subscribers of one stream; 429 beyond")
    idleStreamSeconds: float = Field(86400, ge=0, description="cluster mode: a stream's Redis keys expire after "
                                                              "this long with no publish and no subscriber waiting "
                                                              "on it (0 = never)")
    # Durable invocation output (runtime/durable.py): an SSE invocation's events, readable again by its id.
    invocationRetentionSeconds: float = Field(300, ge=0, description="how long an SSE invocation's output stays "
                                              "readable by its id after it ends (0 = not kept)")
    invocationRetentionBytes: int = Field(1024 * 1024, ge=1, description="bytes of one invocation's output "
                                          "kept, while it runs and after (the oldest events go first)")
    invocationRetentionCount: int = Field(256, ge=0, description="ended invocations kept at once (past it, "
                                          "the oldest of the tenant keeping the most goes first, so one "
                                          "tenant cannot evict another's; 0 = none kept)")


class OpenAIConfig(_Strict):
    """Which deployed function serves each OpenAI-compatible route."""

    chatFunction: str = Field("chat", description="function serving `POST /v1/chat/completions` "
                                                  "for a model no function declares (`models:`)")
    completionsFunction: str = Field("chat", description="function serving `POST /v1/completions` "
                                                         "for a model no function declares (`models:`)")


class ClusterConfig(_Strict):
    """Cluster mode (see runtime/cluster): streams, registry and work queue in Redis."""

    redisUrl: str | None = Field(None, description="`redis://HOST:PORT/DB`, or `redis+cluster://HOST:PORT` for a "
                                                   "Redis Cluster: cluster mode; unset = single process, no Redis")
    role: Literal["all", "frontend", "worker"] = Field("all",
                                                       description="`all` (frontend + worker), `frontend` (queues "
                                                                   "every invocation), `worker`")
    keyPrefix: str = Field("fnstream", min_length=1, description="prefix of every Redis key")
    registrySyncSeconds: float = Field(1.0, gt=0, description="periodic registry re-read (besides pub/sub)")
    workerHeartbeatSeconds: float = Field(1.0, gt=0,
                                          description="worker liveness refresh; a worker is lost after 3 × this")
    claimIdleSeconds: float = Field(5.0, gt=0, description="a queued invocation held this long by a dead worker is "
                                                           "reclaimed")
    outputTtlSeconds: float = Field(60.0, gt=0, description="TTL of per-invocation keys; a worker whose stream "
                                                            "output nobody acks, nor keeps alive, for this long "
                                                            "(its frontend killed, or cut off from Redis; a "
                                                            "frontend whose client stalls renews it) stops the "
                                                            "invocation")
    workerConcurrency: int = Field(64, ge=1, description="invocations one worker node runs at once (each function "
                                                         "also at most its own `concurrency`, which counts per "
                                                         "worker; when several queues' entries arrive at the same "
                                                         "moment, each blocking read may bring one more until they "
                                                         "end)")


class MetricsConfig(_Strict):
    """`GET /metrics` (frontend/metrics.py)."""

    enabled: bool = Field(True, description="count invocations and serve `/metrics`")
    public: bool = Field(False, description="`/metrics` without a token even when auth is on — and with every "
                                            "tenant's function and stream names")
    maxFunctions: int | None = Field(1000, ge=1, description="functions one scrape reports series of (the most "
                                     "invoked first): a scrape's cost stops growing with the function count; "
                                     "`fnstream_metrics_functions_omitted` counts the others (null: all)")


class LoggingConfig(_Strict):
    """Log line format of `fnstream serve` and `fnstream worker` (runtime/logs.py)."""

    format: Literal["text", "json"] = Field("text",
                                            description="`json`: one JSON object per log line with trace id, "
                                                        "function, invocation id; `text`: plain lines")


class Config(_Strict):
    frontend: FrontendConfig = Field(FrontendConfig(),
                                     description="the HTTP side: listener, invocation settings, browsers")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="where handler code lives and runs")
    auth: AuthConfig = Field(AuthConfig(), description="bearer tokens, their tenants and roles")
    tenants: TenantsConfig = Field(TenantsConfig(), description="what one tenant may deploy")
    streams: StreamsConfig = Field(StreamsConfig(), description="named streams")
    openai: OpenAIConfig = Field(OpenAIConfig(),
                                 description="which deployed function serves each OpenAI-compatible route")
    cluster: ClusterConfig = Field(ClusterConfig(),
                                   description="cluster mode: registry, work queue and streams in Redis")
    jobs: JobsConfig = Field(JobsConfig(), description="background jobs (openYuanrong async, RunPod `/v2`)")
    metrics: MetricsConfig = Field(MetricsConfig(), description="`GET /metrics`")
    logging: LoggingConfig = Field(LoggingConfig(), description="log lines of `serve` and `worker`")
    source: str = Field("<defaults>", exclude=True, description="where this config came from")


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. frontend.args.enableEvent=false")
    key, _, raw = text.partition("=")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip().split("."), value


def _apply_override(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: override {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def _describe(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {key!r}")
        else:
            got = "" if "secret" in key else f" (got {e.get('input')!r})"  # a secret never goes to a log
            lines.append(f"{source}: key {key!r}: {e['msg']}{got}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _resolve_paths(cfg: Config, base: Path) -> None:
    cfg.runtime.codeRoots = [(base / p).resolve() for p in cfg.runtime.codeRoots]
    if cfg.runtime.deployDir is not None:
        cfg.runtime.deployDir = (base / cfg.runtime.deployDir).resolve()
    # Data the server writes goes to its data directory, never beside its config: a checkout's
    # config/ (or an empty directory's) holds no state the tests or a second server could trip on.
    data = base / cfg.runtime.dataDir if cfg.runtime.dataDir is not None else Path.cwd() / ".fnstream"
    cfg.runtime.dataDir = data.resolve()
    cfg.jobs.path = (cfg.runtime.dataDir / cfg.jobs.path).resolve()


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                data: dict[str, Any] | None = None, *, base_dir: Path | None = None) -> Config:
    """Load a config file (or a dict, for tests) and apply `key=value` overrides on top.

    Relative paths resolve against the file's directory, or `base_dir` when given (the built-in
    defaults stand in for `./config/default.yaml`).
    """
    if data is not None:
        source, base = "<dict>", Path.cwd()
        data = dict(data)
    else:
        file = Path(path) if path else DEFAULT_CONFIG_PATH
        source, base = str(file), (base_dir or file.parent).resolve()
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: expected a mapping at the top level")
    for text in overrides:
        key_path, value = _parse_override(text)
        _apply_override(data, key_path, value, source)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
    if cfg.cluster.redisUrl and cfg.streams.slowConsumerPolicy == "block":
        raise ConfigError(f"{source}: streams.slowConsumerPolicy: block is not offered in cluster mode "
                          "(cluster.redisUrl is set; a producer cannot see subscribers on other nodes); use cut")
    for proxy in cfg.frontend.trustedProxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"{source}: frontend.trustedProxies: {proxy!r} is not an address or CIDR") from None
    cors = cfg.frontend.cors
    if cors.allowCredentials and {"*", "null"} & {o.strip().lower() for o in cors.allowOrigins}:
        raise ConfigError(f"{source}: frontend.cors.allowOrigins {cors.allowOrigins!r} with "
                          "frontend.cors.allowCredentials: true would let any site call with the user's credentials "
                          "('*' is every origin; 'null' is any sandboxed frame or file:// page, whoever wrote it), "
                          "which the CORS spec forbids; list the origins allowed, or turn allowCredentials off")
    if cfg.frontend.reusePort and not cfg.cluster.redisUrl:
        raise ConfigError(f"{source}: frontend.reusePort needs cluster mode (cluster.redisUrl): embedded servers "
                          "sharing a port would each hold their own functions, streams and invocations")
    cfg.source = source
    _resolve_paths(cfg, base)
    return cfg
