"""One row per HTTP route: what /openapi.json says about it (frontend/openapi.py builds the document).

A route added to the app without a row here is caught by tests/frontend/test_openapi.py; add
the row next to the others of its area (or call `document(...)` from the route's own module).
"""
from __future__ import annotations

from runtime.manifest import FunctionSpec

from .api_models import (
    AsyncAccepted,
    AsyncResult,
    ChatCompletionRequest,
    ClusterStatus,
    CompletionRequest,
    Deleted,
    Deployed,
    FunctionList,
    FunctionOne,
    Health,
    JobInfo,
    JobList,
    Model,
    ModelList,
    PublishResult,
    RunpodHealth,
    RunpodPurged,
    RunpodQueued,
    RunpodRequest,
    RunpodStatus,
    RunpodStream,
    SessionEnded,
    SessionInterrupted,
    StreamDeleted,
    StreamList,
)
from .openapi import SSE, Op, Param, document

_ACCEPT = Param("Accept", "header", "`text/event-stream` for live Server-Sent Events (frontend.args.enableEvent), "
                "else JSON")
_TRACE = (Param("traceparent", "header", "W3C trace context: its trace id becomes the invocation's"),
          Param("X-Trace-Id", "header", "a trace id of your own (when no traceparent is sent)"))
_SESSION = Param("X-Instance-Session", "header", 'keep this turn on one instance: {"sessionID": "...", '
                 '"sessionTTL": seconds, "concurrency": n (-1 exclusive)}')
_MANIFEST = {"model": FunctionSpec, "types": ("application/yaml", "application/json"),
             "description": "a manifest: one function, or a list of them"}
_YR_FUNCTION = {"description": "openYuanrong's function registration JSON (instance counts as strings)"}
_YR_ANSWER = {"json": {"description": '{"code": 0, "message": "SUCCESS", "function": {id, functionVersionUrn, '
                       'revisionId, name, runtime, handler, ...}}'}}
_YR_LIST = {"json": {"description": '{"code": 0, "message": "", "result": {"functions": [FunctionInfo, '
                                    '...], "total": N}}'}}
_YR_UPDATED = {"json": {"description": '{"code": 0, "message": "", "result": {id, functionVersionUrn, revisionId, '
                                       '...}} (as openYuanrong\'s update)'}}
_YR_DELETED = {"json": {"description": "{} (as openYuanrong's delete)"}}
_EVENT = {"description": "the event handed to the handler: any JSON value"}
_INVOKE_DOC = ("The result as JSON, or with `Accept: text/event-stream` every `context.get_stream().write()` as "
               "one SSE event the moment it is written (`id:` 1, 2, ...), the result as the last event, then "
               "`data: [DONE]`. Errors after the first event arrive as a last event `{code, message}`. "
               "With `X-Invoke-Type: async` it runs as a background job instead: 202 `{requestId}`.")
_IDEMPOTENCY = Param("Idempotency-Key", "header", "a job submit with a key used before (same tenant, within "
                    "jobs.idempotencySeconds) answers that job; with another request 422")
_ASYNC = (Param("X-Invoke-Type", "header", "`async`: run it as a background job (202 {requestId})"),
          Param("X-Webhook-Url", "header", "with async: POSTed the result when the job ends"), _IDEMPOTENCY)
_JOB_EVENTS = ("SSE: output item n as `id: n`, live while the job runs, then the result (or error) event and "
               "`data: [DONE]`; reads never consume, any number of readers.")
_LAST_EVENT = (Param("Last-Event-ID", "header", "resume after this item"),
               Param("lastEventId", "query", "as Last-Event-ID (EventSource cannot set headers)"))
_RUNPOD_BODY = {"model": RunpodRequest}
_OPENAI_ERRORS = (400, 404, 429, 500)
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
       accepted=AsyncAccepted, params=(_ACCEPT, _SESSION, *_TRACE, *_ASYNC),
       errors=(400, 404, 406, 409, 413, 422, 429, 500, 503, 504), role="user"),
    Op("POST", "/invocations/{tenant}/{namespace}/{function}/", "invoke",
       "Invoke by tenant, namespace, function[:version]",
       description=_INVOKE_DOC, body=_EVENT, ok=SSE | {"json": _EVENT}, accepted=AsyncAccepted,
       params=(_ACCEPT, _SESSION, *_TRACE, *_ASYNC), errors=(400, 404, 406, 409, 413, 422, 429, 500, 503, 504),
       role="user"),
    # -- instance sessions (runtime/sessions.py)
    Op("POST", "/serverless/v1/functions/{ref}/sessions/{session_id}/interrupt", "sessions",
       "Interrupt a session's running invocations",
       description="Each running invocation of the X-Instance-Session ends with 4001 (a streaming client gets "
                   "the error event, then `[DONE]`); the session stays open for its next turn.",
       ok=SessionInterrupted, errors=(403, 404), role="user"),
    Op("DELETE", "/serverless/v1/functions/{ref}/sessions/{session_id}", "sessions", "End a session",
       description="The session ends (its instance is free again); invocations still running finish.",
       ok=SessionEnded, errors=(403, 404), role="user"),
    # -- jobs (docs/jobs.md)
    Op("GET", "/serverless/v1/functions/async-results/{request_id}", "jobs", "openYuanrong: an async invocation's "
       "state, and its answer once finished", ok=AsyncResult, errors=(404,), role="user"),
    Op("GET", "/serverless/v1/jobs", "jobs", "This tenant's jobs, newest first", ok=JobList, errors=(400,),
       params=(Param("function", "query", "only this function's"), Param("limit", "query", "1-1000, default 100")),
       role="user"),
    Op("GET", "/serverless/v1/jobs/{job_id}", "jobs", "One job", ok=JobInfo, errors=(404,), role="user"),
    Op("GET", "/serverless/v1/jobs/{job_id}/events", "jobs", "A job's output items as live SSE",
       description=_JOB_EVENTS, ok=SSE, params=_LAST_EVENT, errors=(400, 404), role="user"),
    Op("DELETE", "/serverless/v1/jobs/{job_id}", "jobs", "Cancel a queued or running job", ok=JobInfo,
       errors=(404, 409), role="user"),
    # -- RunPod's serverless endpoint API (the runpod SDK; the endpoint id is the function name)
    Op("POST", "/v2/{fn}/run", "runpod", "Submit a job", body=_RUNPOD_BODY, ok=RunpodQueued,
       params=(_IDEMPOTENCY,), errors=(400, 404, 409, 422, 429, 503), role="user"),
    Op("POST", "/v2/{fn}/runsync", "runpod", "Submit a job and wait for it (up to ?wait= ms)", body=_RUNPOD_BODY,
       ok=RunpodStatus, params=(Param("wait", "query", "ms to wait (default and cap jobs.runsyncWaitMs)"),
                                _IDEMPOTENCY), errors=(400, 404, 409, 422, 429, 503), role="user"),
    Op("GET", "/v2/{fn}/status/{job_id}", "runpod", "A job's status (and output once completed)", ok=RunpodStatus,
       errors=(404,), role="user"),
    Op("GET", "/v2/{fn}/stream/{job_id}", "runpod", "The output items not returned by /stream before",
       description="With `Accept: text/event-stream`: " + _JOB_EVENTS, ok=SSE | {"json": {"model": RunpodStream}},
       params=(_ACCEPT, *_LAST_EVENT), errors=(404,), role="user"),
    Op("POST", "/v2/{fn}/stream/{job_id}", "runpod", "The output items not returned by /stream before (as GET)",
       ok=SSE | {"json": {"model": RunpodStream}}, params=(_ACCEPT, *_LAST_EVENT), errors=(404,), role="user"),
    Op("POST", "/v2/{fn}/cancel/{job_id}", "runpod", "Cancel a job", ok=RunpodQueued, errors=(404, 409),
       role="user"),
    Op("POST", "/v2/{fn}/retry/{job_id}", "runpod", "Run a FAILED or TIMED_OUT job again", ok=RunpodQueued,
       errors=(404, 409, 429), role="user"),
    Op("POST", "/v2/{fn}/purge-queue", "runpod", "Cancel the function's queued jobs", ok=RunpodPurged,
       errors=(404,), role="user"),
    Op("GET", "/v2/{fn}/health", "runpod", "Job counts and concurrency slots of the function", ok=RunpodHealth,
       errors=(404,), role="user"),
    Op("POST", "/v2/{fn}/openai/v1/chat/completions", "runpod", "OpenAI chat completions served by function fn",
       body=ChatCompletionRequest, ok=SSE | {"json": {"description": "a chat.completion object"}},
       errors=_OPENAI_ERRORS, role="user"),
    Op("POST", "/v2/{fn}/openai/v1/completions", "runpod", "OpenAI text completions served by function fn",
       body=CompletionRequest, ok=SSE | {"json": {"description": "a text_completion object"}},
       errors=_OPENAI_ERRORS, role="user"),
    Op("GET", "/v2/{fn}/openai/v1/models", "runpod", "The models function fn serves", ok=ModelList, errors=(404,),
       role="user"),
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
    Op("POST", "/serverless/v1/functions", "admin", "openYuanrong: register a function (its JSON: name "
       "0@{service}@{func}, runtime, handler, codePath, concurrentNum...)", body=_YR_FUNCTION, ok=_YR_ANSWER,
       errors=(400, 409)),
    Op("GET", "/serverless/v1/functions", "admin", "openYuanrong: list the caller's tenant's functions",
       ok=_YR_LIST, errors=(400,), params=(Param("name", "query", "part of 0@{service}@{func}"),
                                           Param("versionNumber", "query", "exact version, e.g. latest"),
                                           Param("pageIndex", "query", "page number, from 1 (default 1)"),
                                           Param("pageSize", "query", "functions per page (default 1000)"))),
    Op("GET", "/serverless/v1/functions/{name}", "admin", "openYuanrong: one registered function (name "
       "0@{service}@{func} or its URN)", ok=_YR_ANSWER, errors=(404,)),
    Op("PUT", "/serverless/v1/functions/{name}", "admin", "openYuanrong: update a registered function",
       body=_YR_FUNCTION, ok=_YR_UPDATED, errors=(400, 404, 409)),
    Op("DELETE", "/serverless/v1/functions/{name}", "admin", "openYuanrong: delete a registered function",
       ok=_YR_DELETED, errors=(404,)),
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
       params=(Param("stream", "query", "only this stream"),), errors=(400, 404)),
    Op("DELETE", "/serverless/v1/streams/{name}", "streams", "Delete a named stream", ok=StreamDeleted,
       errors=(400, 404)),
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
       description="Developer role (only its own tenant's samples; admin: every tenant's), or no token with "
                   "metrics.public: true (every tenant's).",
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
