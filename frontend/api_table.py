"""One row per HTTP route: what /openapi.json says about it (frontend/openapi.py builds the document).

A route added to the app without a row here is caught by tests/frontend/test_openapi.py; add
the row next to the others of its area (or call `document(...)` from the route's own module).
"""
from __future__ import annotations

from runtime.manifest import FunctionSpec

from .api_models import (
    ChatCompletionRequest,
    ClusterStatus,
    CompletionRequest,
    Deleted,
    Deployed,
    FunctionList,
    FunctionOne,
    Health,
    Model,
    ModelList,
    PublishResult,
    StreamDeleted,
    StreamList,
)
from .openapi import SSE, Op, Param, document

_ACCEPT = Param("Accept", "header", "`text/event-stream` for live Server-Sent Events (frontend.args.enableEvent), "
                "else JSON")
_TRACE = (Param("traceparent", "header", "W3C trace context: its trace id becomes the invocation's"),
          Param("X-Trace-Id", "header", "a trace id of your own (when no traceparent is sent)"))
_MANIFEST = {"model": FunctionSpec, "types": ("application/yaml", "application/json"),
             "description": "a manifest: one function, or a list of them"}
_EVENT = {"description": "the event handed to the handler: any JSON value"}
_INVOKE_DOC = ("The result as JSON, or with `Accept: text/event-stream` every `context.get_stream().write()` as "
               "one SSE event the moment it is written (`id:` 1, 2, ...), the result as the last event, then "
               "`data: [DONE]`. Errors after the first event arrive as a last event `{code, message}`.")
_SUBSCRIBE = (Param("Last-Event-ID", "header", "resume after this element id"),
              Param("X-Timeout-Ms", "header", "end after this long without an element (event: end)"),
              Param("X-Expect-Num", "header", "end after this many elements"),
              Param("X-Stream-Terminator", "header", "the element that ends the stream"),
              Param("from_id", "query", "as Last-Event-ID (EventSource cannot set headers)"),
              Param("timeout_ms", "query", "as X-Timeout-Ms"), Param("expect_num", "query", "as X-Expect-Num"),
              Param("terminator", "query", "as X-Stream-Terminator"),
              Param("token", "query", "the bearer token, for EventSource"))

document(
    Op("GET", "/healthz", "health", "Liveness", ok=Health, public=True),
    # -- invoke
    Op("POST", "/serverless/v1/functions/{ref}/invocations", "invoke", "Invoke a function (JSON or SSE)",
       description=_INVOKE_DOC + " `{ref}` is the function's name or URN.", body=_EVENT, ok=SSE | {"json": _EVENT},
       params=(_ACCEPT, *_TRACE), errors=(400, 404, 406, 413, 429, 500, 503, 504), role="user"),
    Op("POST", "/invocations/{tenant}/{namespace}/{function}/", "invoke",
       "Invoke by tenant, namespace, function[:version]",
       description=_INVOKE_DOC, body=_EVENT, ok=SSE | {"json": _EVENT}, params=(_ACCEPT, *_TRACE),
       errors=(400, 404, 406, 413, 429, 500, 503, 504), role="user"),
    # -- admin
    Op("POST", "/admin/v1/functions", "admin", "Deploy one function or a list (YAML or JSON manifest)",
       body=_MANIFEST,
       ok=Deployed, status=201, errors=(400, 409)),
    Op("PUT", "/admin/v1/functions", "admin", "Deploy or redeploy every function of a manifest list, all or nothing",
       body=_MANIFEST, ok=Deployed, errors=(400,)),
    Op("GET", "/admin/v1/functions", "admin", "List deployed functions with their status", ok=FunctionList),
    Op("GET", "/admin/v1/functions/{name}", "admin", "One function: manifest and status", ok=FunctionOne,
       errors=(404,)),
    Op("PUT", "/admin/v1/functions/{name}", "admin", "Redeploy a function (a new revision)", body=_MANIFEST,
       ok=Deployed, errors=(400, 404)),
    Op("DELETE", "/admin/v1/functions/{name}", "admin", "Delete a function", ok=Deleted, errors=(404,)),
    # -- named streams
    Op("GET", "/serverless/v1/stream/subscribe", "streams", "Subscribe to a named stream (openYuanrong headers)",
       description="SSE (or msgpack with Accept: application/x-msgpack): one event per element, `id:` its "
                   "sequence id; ends on the terminator, expect_num, the idle timeout (event: end) or event: error.",
       ok=SSE, params=(Param("X-Stream-Name", "header", "the stream (or ?stream=)"),
                       Param("stream", "query", "the stream"),
                       *_SUBSCRIBE), errors=(400,)),
    Op("GET", "/serverless/v1/streams/{name}", "streams", "Subscribe to a named stream (for EventSource)", ok=SSE,
       params=_SUBSCRIBE, errors=(400,)),
    Op("POST", "/serverless/v1/streams/{name}", "streams", "Publish elements (JSON array, NDJSON or msgpack array)",
       body={"description": "a JSON array of elements (strings as their text, other values as JSON)",
             "types": ("application/json", "application/x-ndjson", "application/x-msgpack")},
       ok=PublishResult, errors=(400, 413),
       params=(Param("retain_num", "query", "keep this many elements for replay"),
               Param("retain_bytes", "query", "keep this many bytes"),
               Param("retain_seconds", "query", "keep this long"),
               Param("policy", "query", "block or cut (slow subscribers)"),
               Param("terminator", "query", "the stream's terminator element"),
               Param("X-Timeout-Ms", "header", "policy block: how long to wait for room"))),
    Op("GET", "/serverless/v1/streams", "streams", "List named streams with their statistics", ok=StreamList,
       params=(Param("stream", "query", "only this stream"),)),
    Op("DELETE", "/serverless/v1/streams/{name}", "streams", "Delete a named stream", ok=StreamDeleted),
    # -- OpenAI-compatible
    Op("POST", "/v1/chat/completions", "openai", "OpenAI chat completions (stream: true for SSE chunks)",
       body=ChatCompletionRequest, ok=SSE | {"json": {"description": "a chat.completion object"}},
       errors=(400, 404, 429, 500), role="user"),
    Op("POST", "/v1/completions", "openai", "OpenAI text completions", body=CompletionRequest,
       ok=SSE | {"json": {"description": "a text_completion object"}}, errors=(400, 404, 429, 500), role="user"),
    Op("GET", "/v1/models", "openai", "Models served", ok=ModelList, role="user"),
    Op("GET", "/v1/models/{model}", "openai", "One model", ok=Model, errors=(404,), role="user"),
    # -- operators and browsers
    Op("GET", "/metrics", "operations", "Prometheus metrics (text exposition format)",
       description="Developer role, or no token with metrics.public: true.",
       ok={"text": "text/plain; version=0.0.4"}),
    Op("GET", "/openapi.json", "operations", "This document (OpenAPI 3.1)", ok={"json": {"description": "OpenAPI 3.1"}},
       public=True),
    Op("GET", "/cluster/v1/status", "operations", "Cluster mode: this node, Redis, workers", ok=ClusterStatus,
       cluster_only=True),
    Op("GET", "/", "console", "Redirects to the web console", ok={"redirect": 302}, public=True),
    Op("GET", "/console", "console", "Redirects to /console/", ok={"redirect": 302}, public=True),
    Op("GET", "/console/{path}", "console", "The web console's static files (index.html, console.js, console.css)",
       ok={"text": "text/html"}, errors=(404,), public=True),
)
