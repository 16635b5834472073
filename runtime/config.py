"""fnstream configuration: pydantic models, loaded from a YAML file plus `-s key=value` overrides.

Unknown keys and wrong types are refused at start, and the message names the key, the file and
what was expected. Relative paths are resolved against the directory of the config file.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError

__all__ = ("Config", "FrontendConfig", "FrontendArgs", "FrontendLimits", "RuntimeConfig", "AuthConfig",
           "AuthToken", "StreamsConfig", "OpenAIConfig", "ClusterConfig", "CorsConfig", "MetricsConfig",
           "LoggingConfig", "JobsConfig", "WebhookConfig", "load_config", "DEFAULT_CONFIG_PATH",
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
    enableEvent: bool = False
    maxRequestBodySize: float = Field(6, gt=0, description="MB")
    heartbeatSeconds: float = Field(15, gt=0)
    streamBufferEvents: int = Field(100, ge=1, description="per-invocation output buffer (events)")
    streamBufferBytes: int = Field(4 * 1024 * 1024, ge=1, description="per-invocation output buffer (bytes); "
                                   "one larger write still passes alone")
    maxWriteSize: int = Field(4 * 1024 * 1024, ge=1, description="bytes per stream write")
    maxResponseSize: int = Field(6 * 1024 * 1024, ge=1, description="bytes of a JSON result")
    shutdownGraceSeconds: float = Field(10, ge=0, description="in-flight invocations may finish this long on SIGTERM")


class FrontendLimits(_Strict):
    """Connection limits of the listener (frontend/server.py); every key is documented in docs/configuration.md."""

    keepAliveSeconds: float = Field(75, gt=0, description="an idle keep-alive connection is closed after this")
    headerTimeoutSeconds: float = Field(10, gt=0, description="a request's line and headers must arrive within "
                                        "this, from connect or from the first byte after a response")
    bodyTimeoutSeconds: float = Field(60, gt=0, description="a request body must arrive within this once its "
                                      "headers did; never applies to the response (SSE runs as long as it needs)")
    sendTimeoutSeconds: float = Field(60, gt=0, description="a response the client takes none of for this long "
                                      "(its socket full) is aborted; a slow reader that keeps taking is not")
    maxHeaderFieldSize: int = Field(8190, ge=256, description="bytes of the URL, and of each header's name and "
                                    "of its value")
    maxHeaders: int = Field(128, ge=1, description="header lines per request")
    maxHeaderBytes: int = Field(64 * 1024, ge=1024, description="bytes of one request's line and headers while "
                                "they arrive; past it 431")
    maxHeaderBytesInFlight: int = Field(64 * 1024 * 1024, ge=1024, description="bytes of unfinished request "
                                        "heads held across all connections; past it the connection adding "
                                        "more gets 503")
    maxConnections: int = Field(10000, ge=1, description="open connections; past it new ones get 503")
class CorsConfig(_Strict):
    """Cross-origin access for browser pages on other origins (frontend/cors.py)."""

    allowOrigins: list[str] = Field(default_factory=list, description="origins allowed ('*' = any); empty = CORS off")
    allowCredentials: bool = False
    maxAgeSeconds: int = Field(600, ge=0, description="how long a browser may cache a preflight answer")
    exposeHeaders: list[str] = Field(default_factory=lambda: ["X-Trace-Id", "X-Inner-Code", "X-Billing-Duration"])


class FrontendConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8888, ge=0, le=65535)
    backlog: int = Field(2048, ge=1, le=2**31 - 1,  # listen() takes a C int; the kernel caps it at somaxconn
                         description="listen backlog: connections the kernel queues before accept")
    loop: Literal["auto", "asyncio", "uvloop"] = Field("auto", description="event loop; auto = uvloop when "
                                                      "importable (serve and worker)")
    reusePort: bool = Field(False, description="SO_REUSEPORT: several cluster-mode frontends share one port")
    limits: FrontendLimits = FrontendLimits()
    args: FrontendArgs = FrontendArgs()
    cors: CorsConfig = CorsConfig()
    allowedHosts: list[str] | None = Field(None, description="Host header values served (421 otherwise); unset = "
                                           "localhost, the listening host and IP literals (any Host when bound to "
                                           "a wildcard with auth on); ['*'] = any")
    trustedProxies: list[str] = Field(default_factory=list, description="addresses/CIDRs whose X-Forwarded-* "
                                      "headers are believed; empty = none")


class RuntimeConfig(_Strict):
    threadPoolSize: int = Field(64, ge=1, description="threads for plain `def` handlers")
    threadsPerFunction: int | None = Field(None, ge=1, description="threads one function may hold (running or "
                                           "overrunning its timeout); default: a quarter of threadPoolSize")
    codeRoots: list[Path] = Field(default_factory=list, description="directories handler code may live in")
    deployDir: Path | None = None


class AuthToken(_Strict):
    """A token, the tenant it belongs to and its role: `user` invokes, `developer` also manages its
    tenant's functions and streams, `admin` manages every tenant's (runtime/principal.py)."""

    token: str = Field(min_length=1, pattern=r"^\S+$", description="no whitespace: tokens are matched exactly")
    tenant: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
    role: Literal["user", "developer", "admin"] = "user"


class AuthConfig(_Strict):
    tokens: list[AuthToken] = Field(default_factory=list)


class StreamsConfig(_Strict):
    """Named-stream settings (see runtime/streams; every key is documented in docs/configuration.md)."""

    subscriberBuffer: int = Field(1000, ge=1, description="elements buffered per subscription")
    subscriberBufferBytes: int = Field(4 * 1024 * 1024, ge=1, description="bytes buffered per subscription; one "
                                       "larger element still passes alone")
    slowConsumerPolicy: Literal["block", "cut"] = "cut"
    blockTimeoutMs: int = Field(5000, ge=0, description="how long 'block' makes a producer wait")
    retainNum: int = Field(0, ge=0)
    retainBytes: int = Field(0, ge=0)
    retainSeconds: float = Field(0, ge=0)
    maxStreamSize: int = Field(64 * 1024 * 1024, ge=1, description="cap on retained bytes per stream")
    subscribeTimeoutMs: int = Field(0, ge=0, description="idle timeout of a REST subscription; 0 = none")
    terminators: list[str] = Field(default_factory=lambda: ["[DONE]", "\\xE0\\xFF\\xE0\\xFF"])
    maxElementSize: int = Field(4 * 1024 * 1024, ge=1)
    maxElementsPerPublish: int = Field(10000, ge=1, description="elements in one publish request (413 beyond); "
                                       "a handler's producer flushes at this many")
    maxStreams: int = Field(10000, ge=1)
    maxSubscribersPerStream: int = Field(10000, ge=1)
    idleStreamSeconds: float = Field(86400, ge=0, description="cluster mode: a stream with no publish and no "
                                     "subscriber waiting on it this long is forgotten; 0 = never")


class OpenAIConfig(_Strict):
    """Which deployed function serves each OpenAI-compatible route."""

    chatFunction: str = "chat"
    completionsFunction: str = "chat"


class ClusterConfig(_Strict):
    """Cluster mode (see runtime/cluster): streams, registry and work queue in Redis."""

    redisUrl: str | None = Field(None, description="redis://HOST:PORT/DB, or redis+cluster://HOST:PORT for a "
                                 "Redis Cluster; unset = single-process mode")
    role: Literal["all", "frontend", "worker"] = "all"
    keyPrefix: str = Field("fnstream", min_length=1)
    registrySyncSeconds: float = Field(1.0, gt=0)
    workerHeartbeatSeconds: float = Field(1.0, gt=0)
    claimIdleSeconds: float = Field(5.0, gt=0, description="a queued invocation idle this long is reclaimed")
    outputTtlSeconds: float = Field(60.0, gt=0, description="per-invocation keys expire after this")
    workerConcurrency: int = Field(64, ge=1, description="invocations a worker node runs at once")


class WebhookConfig(_Strict):
    """Job-end webhook deliveries (runtime/jobs/webhooks.py)."""

    timeoutSeconds: float = Field(10, gt=0, description="per delivery attempt")
    attempts: int = Field(4, ge=1, le=10, description="first try plus retries after 1 s, 2 s, 4 s, ...")
    queueSize: int = Field(1000, ge=1, description="deliveries waiting or in progress; beyond, dropped and logged")
    tenantQueueSize: int = Field(100, ge=1, description="the same per tenant: one tenant's slow receiver "
                                 "never gets another tenant's webhooks dropped")
    allowedHosts: list[str] = Field(default_factory=list, description="hosts a webhook may call; empty = any")
    allowPrivate: bool = Field(False, description="let webhooks reach loopback, private, link-local and other "
                               "non-public addresses (refused by default: any user could make the server call them)")


class JobsConfig(_Strict):
    """Background jobs (runtime/jobs; every key is documented in docs/jobs.md)."""

    store: Literal["auto", "sqlite", "memory", "redis"] = Field(
        "auto", description="auto: redis in cluster mode (cluster.redisUrl), else sqlite")
    path: Path = Field(Path("fnstream-jobs.sqlite3"), description="sqlite file, relative to the config file")
    maxQueued: int = Field(1000, ge=1, description="jobs waiting to start; beyond, 429")
    maxQueuedPerTenant: int = Field(250, ge=1, description="jobs of one tenant waiting to start; beyond, 429 "
                                    "(one tenant's backlog leaves room for the others')")
    maxInputBytes: int = Field(10 * 1024 * 1024, ge=1, description="input bytes (JSON) per job; beyond, 413 at "
                               "submit (RunPod's /run limit)")
    maxInputBytesSync: int = Field(20 * 1024 * 1024, ge=1, description="the same for /runsync (RunPod's limit)")
    tenantQuotaBytes: int = Field(1024 * 1024 * 1024, ge=1, description="bytes (inputs and outputs) one "
                                  "tenant's kept jobs may hold; beyond, 507 at submit")
    maxOutputBytes: int = Field(10 * 1024 * 1024, ge=1, description="output bytes per job; beyond, FAILED")
    retentionSeconds: float = Field(3600, gt=0, description="finished jobs and their output expire after this")
    runsyncWaitMs: int = Field(90_000, ge=0, description="default and maximum wait of /runsync")
    takeoverSeconds: float = Field(15, gt=0, description="cluster mode: a node's unfinished jobs pass to another "
                                   "node this long after it stops renewing its lease")
    webhook: WebhookConfig = WebhookConfig()


class MetricsConfig(_Strict):
    """`GET /metrics` (frontend/metrics.py)."""

    enabled: bool = Field(True, description="count invocations and serve /metrics")
    public: bool = Field(False, description="serve /metrics without a token even when auth is on: every "
                                            "tenant's function and stream names to anyone who can reach it")


class LoggingConfig(_Strict):
    """Log line format of `fnstream serve` and `fnstream worker` (runtime/logs.py)."""

    format: Literal["text", "json"] = "text"


class Config(_Strict):
    frontend: FrontendConfig = FrontendConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    auth: AuthConfig = AuthConfig()
    streams: StreamsConfig = StreamsConfig()
    openai: OpenAIConfig = OpenAIConfig()
    cluster: ClusterConfig = ClusterConfig()
    jobs: JobsConfig = JobsConfig()
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
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
            lines.append(f"{source}: key {key!r}: {e['msg']} (got {e.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def _resolve_paths(cfg: Config, base: Path) -> None:
    cfg.runtime.codeRoots = [(base / p).resolve() for p in cfg.runtime.codeRoots]
    if cfg.runtime.deployDir is not None:
        cfg.runtime.deployDir = (base / cfg.runtime.deployDir).resolve()
    cfg.jobs.path = (base / cfg.jobs.path).resolve()


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
    if cors.allowCredentials and "*" in cors.allowOrigins:
        raise ConfigError(f"{source}: frontend.cors.allowOrigins ['*'] with frontend.cors.allowCredentials: true "
                          "would let every site (Origin: null too) call with the user's credentials, which the "
                          "CORS spec forbids; list the origins allowed, or turn allowCredentials off")
    if cfg.frontend.reusePort and not cfg.cluster.redisUrl:
        raise ConfigError(f"{source}: frontend.reusePort needs cluster mode (cluster.redisUrl): embedded servers "
                          "sharing a port would each hold their own functions, streams and invocations")
    cfg.source = source
    _resolve_paths(cfg, base)
    return cfg
