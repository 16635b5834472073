"""`GET /openapi.json`: an OpenAPI 3.1 document of the routes this app really registers.

Routes are described by rows (`Op`) that route areas contribute with `document()` (the rows of
today's routes are in frontend/api_table.py). The document walks the app's router, so it lists
exactly what is registered (cluster routes only in cluster mode); a registered route without a
row still appears, marked undocumented, and the test suite fails on it. Schemas come from
pydantic models (the code's own, such as FunctionSpec, and frontend/api_models.py).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

__all__ = ("Op", "Param", "SSE", "document", "OPERATIONS", "registered_routes", "build_document", "routes")

routes = web.RouteTableDef()

SSE: dict[str, Any] = {"sse": True}
# The schema of a text/event-stream answer is that of each event (as OpenAPI 3.2's itemSchema; a
# stream of events is not one string): `data` always, `event` and `id` when the route sends them.
_SSE_EVENT: dict[str, Any] = {
    "type": "object", "description": "one Server-Sent Event", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}}}
_REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "header" or "query"
    description: str = ""


@dataclass(frozen=True)
class Op:
    """One route: method and path as registered (`{name}` parameters), tag, summary and shapes.

    `body`: a pydantic model, or a dict with `model` and/or `description` and `types`.
    `ok`: a pydantic model, or a dict with any of `sse`, `json` (a model or a schema description),
    `text` (a content type), `redirect` (a status). `accepted`: the 202 answer's model, when the
    route can also answer 202 (a background job). `role`: the token role needed (`user`, or
    `developer` by default); `public`: no token at all.
    """

    method: str
    path: str
    tag: str
    summary: str
    description: str = ""
    body: Any = None
    ok: Any = None
    status: int = 200
    accepted: Any = None
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    role: str = "developer"
    public: bool = False
    cluster_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


OPERATIONS: dict[tuple[str, str], Op] = {}


def document(*ops: Op) -> None:
    """Describe routes (called at import by the modules that own them)."""
    for op in ops:
        OPERATIONS[(op.method.upper(), op.path)] = op


def registered_routes(app: web.Application) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route the app serves; aiohttp's automatic HEADs left out."""
    found = set()
    for route in app.router.routes():
        if route.method in ("HEAD", "OPTIONS") or route.resource is None:
            continue
        found.add((route.method, _PATH_PARAM.sub(r"{\1}", route.resource.canonical)))
    return found


class _Schemas:
    """Collects the models an operation names into components/schemas."""

    def __init__(self) -> None:
        self.models: dict[str, type[BaseModel]] = {}

    def ref(self, model: type[BaseModel]) -> dict[str, Any]:
        self.models[model.__name__] = model
        return {"$ref": _REF.format(model=model.__name__)}

    def components(self) -> dict[str, Any]:
        from runtime.manifest import FunctionSpec

        self.models.setdefault("FunctionSpec", FunctionSpec)
        found = dict(_components(tuple(sorted(self.models.items()))))
        # FunctionInfo (an answer) extends the manifest's fields (allOf), which a manifest may not
        # add to (additionalProperties: false); an answer adds `urn` and `status`: an open copy.
        found["FunctionFields"] = {k: v for k, v in found["FunctionSpec"].items() if k != "additionalProperties"}
        return found


@functools.lru_cache(maxsize=8)
def _components(models: tuple[tuple[str, type[BaseModel]], ...]) -> dict[str, Any]:
    _, top = models_json_schema([(m, "serialization") for _, m in models], ref_template=_REF)
    return dict(sorted(top.get("$defs", {}).items()))


def _schema(value: Any, schemas: _Schemas) -> dict[str, Any]:
    if isinstance(value, type) and issubclass(value, BaseModel):
        return schemas.ref(value)
    if isinstance(value, dict):
        if "model" in value:
            return schemas.ref(value["model"])
        return {"description": value.get("description", "")}
    return {}


def _error_body(op: Op, schemas: _Schemas) -> dict[str, Any]:
    from .api_models import ErrorBody, OpenAIErrorBody, RunpodErrorBody
    from .errors import is_openai_path, is_runpod_path

    model = OpenAIErrorBody if is_openai_path(op.path) else RunpodErrorBody if is_runpod_path(op.path) else ErrorBody
    return {"application/json": {"schema": schemas.ref(model)}}


_REASONS = {400: "bad request", 401: "no or invalid token", 403: "forbidden (role, tenant or origin)",
            404: "not found", 406: "not acceptable", 409: "already exists, or in a state that refuses it",
            413: "body too large", 422: "an Idempotency-Key used before with another request",
            429: "concurrency limit reached", 500: "the function failed", 503: "unavailable (shutting down, cluster)",
            504: "the function timed out"}


def _success(op: Op, schemas: _Schemas) -> tuple[str, dict[str, Any]]:
    ok = op.ok
    if isinstance(ok, dict) and "redirect" in ok:
        return str(ok["redirect"]), {"description": "redirect", "headers": {"Location": {"schema": {"type": "string"}}}}
    content: dict[str, Any] = {}
    if isinstance(ok, dict):
        if ok.get("sse"):
            content["text/event-stream"] = {"schema": _SSE_EVENT}
        if "json" in ok:
            content["application/json"] = {"schema": _schema(ok["json"], schemas)}
        if "text" in ok:
            content[ok["text"]] = {"schema": {"type": "string"}}
    elif ok is not None:
        content["application/json"] = {"schema": _schema(ok, schemas)}
    answer: dict[str, Any] = {"description": "success"}
    if content:
        answer["content"] = content
    answer["headers"] = {name: {"schema": {"type": "string"}, "description": doc} for name, doc in (
        ("X-Trace-Id", "the trace id"), ("X-Request-Id", "the same id (SDKs read it as request_id)"),
        ("traceparent", "W3C trace context of this server's span"))}
    return str(op.status), answer


def _operation(op: Op, schemas: _Schemas, auth_on: bool) -> dict[str, Any]:
    slug = re.sub(r"[^a-zA-Z0-9]+", "_", op.path).strip("_") or "root"
    out: dict[str, Any] = {"tags": [op.tag], "summary": op.summary, "operationId": f"{op.method.lower()}_{slug}"}
    if op.description:
        out["description"] = op.description
    params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
              for n in _PATH_PARAM.findall(op.path)]
    params += [{"name": p.name, "in": p.where, "required": False, "schema": {"type": "string"},
                "description": p.description} for p in op.params]
    if params:
        out["parameters"] = params
    if op.body is not None:
        types = op.body.get("types", ("application/json",)) if isinstance(op.body, dict) else ("application/json",)
        body_schema = _schema(op.body, schemas)
        out["requestBody"] = {"required": True, "content": {t: {"schema": body_schema} for t in types}}
        if isinstance(op.body, dict) and op.body.get("description"):
            out["requestBody"]["description"] = op.body["description"]
    status, success = _success(op, schemas)
    responses = {status: success}
    if op.accepted is not None:
        responses["202"] = {"description": "accepted as a background job",
                            "content": {"application/json": {"schema": _schema(op.accepted, schemas)}}}
    codes = set(op.errors)
    if not op.public:
        codes |= {401, 403}
    for code in sorted(codes):
        responses[str(code)] = {"description": _REASONS.get(code, "error"), "content": _error_body(op, schemas)}
    out["responses"] = responses
    out["security"] = [] if op.public else [{"bearer": []}, {"xAuth": []}]
    if not op.public:
        out["x-fnstream-role"] = op.role
    return out


def build_document(app: web.Application) -> dict[str, Any]:
    from .keys import CONFIG

    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    auth_on = bool(app[CONFIG].auth.tokens)
    for method, path in sorted(registered_routes(app), key=lambda mp: (mp[1], mp[0])):
        op = OPERATIONS.get((method, path)) or Op(method, path, "undocumented", "(undocumented route)")
        paths.setdefault(path, {})[method.lower()] = _operation(op, schemas, auth_on)
    return {
        "openapi": "3.1.0",
        "info": {"title": "fnstream", "version": "0.1.0",
                 "description": "Python function-service runtime for streaming work: invoke as JSON or live "
                                "Server-Sent Events, named streams, OpenAI-compatible routes."},
        "paths": paths,
        "components": {
            "schemas": schemas.components(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "xAuth": {"type": "apiKey", "in": "header", "name": "X-Auth"}},
        },
    }


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(build_document(request.app))
