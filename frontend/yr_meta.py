"""openYuanrong's function-registration JSON, both ways: its request body -> a fnstream manifest
entry, and a Deployment -> its FunctionInfo answer (`/serverless/v1/functions`).

Only the mapping lives here; deploying goes through the admin API's path (frontend/routes/admin.py).
"""
from __future__ import annotations

import re
from typing import Any

from runtime.deployment import Deployment
from runtime.errors import BadRequestError

__all__ = ("manifest_entry", "function_info", "is_yr_name", "split_name", "yr_name")

# openYuanrong's function names (meta_service function_repo/utils/customvalidator.go funNameReg):
# `0@{service}@{func}` or `0-{service}-{func}`; fnstream's own name rules then apply to `func`.
_YR_NAME_RE = re.compile(r"^0(?P<sep>[@-])(?P<service>[0-9A-Za-z]{1,16})(?P=sep)"
                         r"(?P<func>[a-z0-9][a-z0-9-]{0,126}[a-z0-9]|[a-z])$")
_MAX_TIMEOUT = 8_640_000  # openYuanrong clamps longer timeouts to this


def is_yr_name(name: Any) -> bool:
    """A name in openYuanrong's form (never a fnstream name: those start with a letter)."""
    return isinstance(name, str) and name[:2] in ("0@", "0-")


def split_name(name: Any) -> tuple[str, str]:
    """`0@{service}@{func}` (or `0-{service}-{func}`) -> (service, func); 400 otherwise."""
    m = _YR_NAME_RE.match(name) if isinstance(name, str) else None
    if m is None:
        raise BadRequestError(f"field 'name': {name!r} is not '0@{{service}}@{{func}}' or '0-{{service}}-{{func}}' "
                              "(service: 1-16 letters and digits; func: lowercase letters, digits and '-', at most "
                              "128, not ending with '-')")
    return m["service"], m["func"]


def yr_name(dep: Deployment) -> str:
    return f"0@{dep.spec.namespace}@{dep.spec.name}"


def _count(body: dict[str, Any], key: str) -> int | None:
    """openYuanrong sends instance counts as strings ("2"); integers are taken too."""
    value = body.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise BadRequestError(f"field {key!r} must be a string of digits, e.g. \"2\" (got {value!r})")
    return int(value)


def _runtime(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequestError("field 'runtime' is required, e.g. \"python3.9\"")
    if value.startswith("java"):
        return value
    if re.fullmatch(r"python3(\.\d+)?", value):
        known = ("python3.9", "python3.10", "python3.11", "python3.12", "python3.13")
        return value if value in known else "python3"  # python3.6/3.8: this server's Python runs it
    raise BadRequestError(f"field 'runtime': {value!r} is not supported here (python3.x and java8/11/17/21 are)")


def manifest_entry(body: Any, name: str | None = None) -> dict[str, Any]:
    """The manifest entry (fnstream's fields) for an openYuanrong registration body; 400 if bad."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object (openYuanrong's function registration)")
    service, func = split_name(body.get("name", name))
    if name is not None and (service, func) != split_name(name):
        raise BadRequestError(f"field 'name': {body['name']!r} is not the function of the path ({name!r})")
    kind = body.get("kind", "faas")
    if kind != "faas":
        raise BadRequestError(f"field 'kind': {kind!r} is not supported here (only 'faas' function services)")
    storage = body.get("storageType", "local")
    if storage not in ("local", "copy"):
        raise BadRequestError(f"field 'storageType': {storage!r} is not supported here ('local' or 'copy' with "
                              "codePath)")
    entry: dict[str, Any] = {"name": func, "namespace": service, "runtime": _runtime(body.get("runtime"))}
    for src, dst in (("handler", "handler"), ("codePath", "codePath"), ("description", "description"),
                     ("memory", "memory"), ("environment", "environment")):
        if body.get(src) not in (None, ""):
            entry[dst] = body[src]
    if body.get("timeout") is not None:
        timeout = body["timeout"]
        entry["timeout"] = min(timeout, _MAX_TIMEOUT) if isinstance(timeout, int | float) else timeout
    extended = body.get("extendedHandler") or {}
    if not isinstance(extended, dict):
        raise BadRequestError("field 'extendedHandler' must be an object {initializer, pre_stop}")
    for src, dst in (("initializer", "initializer"), ("pre_stop", "preStop")):
        if extended.get(src):
            entry[dst] = extended[src]
    concurrent = _count(body, "concurrentNum")
    if concurrent is not None:
        entry["concurrency"] = concurrent  # per instance; an in-process function is one instance
    low, high = _count(body, "minInstance"), _count(body, "maxInstance")
    if low is not None:
        entry["minInstances"] = low
    if high is not None and high > 0:
        entry["maxInstances"] = high
    return entry


def function_info(dep: Deployment) -> dict[str, Any]:
    """openYuanrong's FunctionInfo of a deployed function."""
    spec = dep.spec
    return {"id": spec.urn, "functionVersionUrn": spec.urn, "functionUrn": spec.urn.rpartition(":")[0],
            "revisionId": str(dep.revision), "name": yr_name(dep), "tenantId": spec.tenant,
            "versionNumber": spec.version, "runtime": spec.runtime, "description": spec.description,
            "handler": spec.handler, "memory": spec.memory, "timeout": spec.timeout,
            "environment": spec.environment,
            "extendedHandler": {k: v for k, v in (("initializer", spec.initializer), ("pre_stop", spec.preStop))
                                if v},
            "minInstance": spec.minInstances or 0, "maxInstance": spec.maxInstances or 0,
            "concurrentNum": spec.concurrency, "status": "error" if dep.init_error else "active"}
