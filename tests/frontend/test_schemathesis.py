"""Schemathesis against the server's own `/openapi.json`: the real `fnstream serve` over a real
socket, every documented route, a bounded example budget (CI runs it; ~1 minute on a loaded box).

Checks: no 5xx other than those a route documents for a handler's own failure (a 500 with code
4001/4007, or 503 where documented); each answer's status, content type and body conform to the
document. The Hypothesis fuzz (test_fuzz_routes.py) covers what the document cannot describe
(hostile bytes, deep nesting, encodings).
"""
from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = 40           # per operation (about 60 routes); the run stays well under a minute
HANDLER_CODES = {4001, 4007}
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
BUDGET = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def _no_undocumented_5xx(response, case) -> None:
    if response.status_code < 500:
        return
    documented = str(response.status_code) in case.operation.definition.raw.get("responses", {})
    try:
        body = json.loads(response.content)
    except ValueError:
        body = {}
    code = body.get("code") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
    assert documented and (code in HANDLER_CODES or response.status_code == 503), (
        f"{case.method} {case.formatted_path}: {response.status_code} {response.content[:300]!r}")


@pytest.mark.timeout(300)
def test_every_documented_route_conforms_to_openapi_json(start_server):
    server = start_server("-s", "streams.subscribeTimeoutMs=100", "-s", "jobs.runsyncWaitMs=200",
                          env={"FNSTREAM_LOG": "ERROR"})
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures: list[str] = []
    tested = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        tested.add((operation.method.upper(), operation.path))

        @BUDGET
        @given(case=operation.as_strategy())
        def run(case) -> None:
            if "X-Timeout-Ms" in (case.headers or {}):
                case.headers["X-Timeout-Ms"] = "100"   # a subscription waits at most this long
            response = case.call(base_url=server.url, timeout=20)
            _no_undocumented_5xx(response, case)
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except BaseException as exc:  # one report for every operation (schemathesis raises exception groups)
            if isinstance(exc, KeyboardInterrupt):
                raise
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    documented = {(m.upper(), path) for path, methods in schema.raw_schema["paths"].items() for m in methods}
    # Every documented route was exercised (schemathesis leaves out the document's own route).
    assert documented - tested == {("GET", "/openapi.json")} and len(tested) > 30
    assert not failures, "\n\n".join(failures)
