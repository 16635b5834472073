"""GET /openapi.json against the routes the app really registers: none undocumented, none invented."""
import json
import re

from frontend.app import build_app
from frontend.openapi import OPERATIONS, build_document, registered_routes
from tests.support.servers import make_config

CLUSTER = {"cluster.redisUrl": "redis://127.0.0.1:1/0"}  # the app is built, never started


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _doc_routes(doc) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, item in doc["paths"].items() for m in item}


async def test_document_lists_exactly_the_registered_routes(client):
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["openapi"] == "3.1.0"
    registered = registered_routes(client.server.app)
    assert _doc_routes(doc) == registered
    undocumented = sorted(mp for mp in registered if mp not in OPERATIONS)
    assert undocumented == [], f"routes without a row in frontend/api_table.py (or a document() call): {undocumented}"
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op["tags"] != ["undocumented"] and op["summary"], (method, path)
            for name in re.findall(r"\{(\w+)\}", path):
                assert {"name": name, "in": "path"}.items() <= next(
                    p for p in op["parameters"] if p["name"] == name).items()


def test_every_row_names_a_route_some_configuration_registers():
    seen = set()
    for overrides in ({}, CLUSTER, {"auth.tokens": [{"token": "t", "role": "developer"}]}):
        seen |= registered_routes(build_app(make_config(**overrides)))
    invented = sorted(mp for mp in OPERATIONS if mp not in seen)
    assert invented == [], f"rows for routes no app registers: {invented}"


def test_cluster_and_metrics_routes_follow_the_configuration():
    cluster_doc = build_document(build_app(make_config(**CLUSTER)))
    assert "/cluster/v1/status" in cluster_doc["paths"]
    plain = build_document(build_app(make_config(**{"metrics.enabled": False})))
    assert "/cluster/v1/status" not in plain["paths"] and "/metrics" not in plain["paths"]


async def test_schemas_come_from_the_models_and_every_ref_resolves(client):
    doc = await (await client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    for ref in set(_refs(doc)):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    spec = schemas["FunctionSpec"]  # the manifest model itself (runtime.manifest.FunctionSpec)
    assert {"name", "handler", "timeout", "concurrency"} <= set(spec["properties"])
    assert set(schemas["StreamStats"]["properties"]) >= {"produced", "delivered", "dropped", "retained_bytes"}
    post = doc["paths"]["/admin/v1/functions"]["post"]
    assert post["requestBody"]["content"]["application/yaml"]["schema"] == {"$ref": "#/components/schemas/FunctionSpec"}
    invoke = doc["paths"]["/serverless/v1/functions/{ref}/invocations"]["post"]
    assert "text/event-stream" in invoke["responses"]["200"]["content"]
    assert invoke["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIErrorBody")
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    json.dumps(doc)  # plain JSON throughout


async def test_document_is_valid_openapi_3_1(client):
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation import OpenAPIV31SpecValidator

    doc = await (await client.get("/openapi.json")).json()
    validate(doc, cls=OpenAPIV31SpecValidator)
