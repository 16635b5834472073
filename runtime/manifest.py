"""Function manifests: the YAML (or JSON) that describes a function service.

A manifest holds one function or a list of them. Every error names the file, the function's
position and the field; a file with any bad function yields no functions at all.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ManifestError
from .executors import SELECTABLE
from .safe_yaml import load_untrusted

__all__ = ("FunctionSpec", "parse_manifest", "load_manifest_file", "load_deploy_dir", "function_urn")

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_HANDLER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*\.[A-Za-z_][A-Za-z0-9_]*$")
# Java: `pkg.Class::method` (AWS Lambda, Alibaba FC) or openYuanrong's `pkg.Class.method`; hooks may
# also name a bare method of the handler's class.
_JAVA_ID = r"[A-Za-z_$][A-Za-z0-9_$]*"
_JAVA_HANDLER_RE = re.compile(rf"^{_JAVA_ID}(\.{_JAVA_ID})*(::|\.){_JAVA_ID}$")
_JAVA_HOOK_RE = re.compile(rf"^({_JAVA_ID}(\.{_JAVA_ID})*(::|\.))?{_JAVA_ID}$")
JAVA_RUNTIMES = ("java8", "java11", "java17", "java21")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # `handler: MODULE`: its runpod.serverless.start()
_IDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class FunctionSpec(BaseModel):
    """One function service, as written in a manifest (camelCase keys, as openYuanrong's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str
    handler: str = Field("handler", description="module.function (Java: package.Class::method), or a module "
                         "that calls runpod.serverless.start() (a RunPod worker file)")
    codePath: Path = Field(Path("."), description="directory of the handler module, relative to the manifest")
    runtime: Literal["python3", "python3.9", "python3.10", "python3.11", "python3.12", "python3.13",
                     "java8", "java11", "java17", "java21"] = Field(
        "python3", description="java*: run on the installed JDK (17 or later) in worker JVMs")
    initializer: str | None = Field(None, description="module.function run once before the first invocation")
    preStop: str | None = None
    timeout: float = Field(900, gt=0, le=8_640_000, description="seconds")
    concurrency: int = Field(100, ge=1, description="max concurrent invocations")
    memory: int = Field(512, ge=1, description="MB")
    environment: dict[str, str] = Field(default_factory=dict)
    version: str = "latest"
    tenant: str = "default"
    namespace: str = "default"
    description: str = ""
    rawStream: bool = Field(False, description="send stream writes verbatim (handler frames its own SSE)")
    onDisconnect: Literal["cancel", "continue"] = Field(
        "cancel", description="when an SSE client drops: cancel the invocation, or let it run on, its output "
                              "kept for GET /serverless/v1/invocations/{id}/events")
    models: list[str] = Field(default_factory=list, description="model ids served (OpenAI routes)")
    modelAliases: dict[str, str] = Field(default_factory=dict, description="{alias: served model}: other model "
                                         "names the OpenAI routes accept for this function (e.g. gpt-4o-mini)")
    executor: str | None = Field(
        None, description="where handlers run; default: async for async handlers, thread for plain def",
        json_schema_extra={"enum": [*SELECTABLE, None]})
    instances: int | None = Field(None, ge=1, le=256,
                                  description="executor: process: a fixed number of workers (minInstances = "
                                              "maxInstances = instances); not together with those two")
    instanceConcurrency: int | None = Field(
        None, ge=1, le=10_000,
        description="executor: process: invocations one worker runs at once; default 100 for async handlers, "
                    "1 for plain def / generator handlers")
    minInstances: int | None = Field(
        None, ge=0, le=256, description="executor: process: workers kept running; default 1, 0 = scale to zero")
    maxInstances: int | None = Field(
        None, ge=1, le=256, description="executor: process: most workers; default min(concurrency, CPUs)")
    scaleDownIdleSeconds: float = Field(
        60, gt=0, le=86_400, description="executor: process: a worker idle this long above minInstances exits")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must start with a lowercase letter and use a-z, 0-9 and '-' (at most 63)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _java_runs_in_workers(cls, data: Any) -> Any:
        """A Java function always runs in worker processes (JVMs): `executor` is 'process' or absent."""
        if isinstance(data, dict) and data.get("runtime") in JAVA_RUNTIMES:
            if data.get("executor") not in (None, "process"):
                raise ValueError(f"field 'executor': a {data['runtime']} function runs in worker JVMs: "
                                 "use 'process' or leave it out")
            data = {**data, "executor": "process"}
        return data

    @field_validator("executor")
    @classmethod
    def _executor_kind(cls, value: str | None) -> str | None:
        """One of the kinds a manifest may name (runtime/executors.py SELECTABLE)."""
        if value is not None and value not in SELECTABLE:
            raise ValueError(f"Input should be {', '.join(repr(k) for k in SELECTABLE[:-1])} or {SELECTABLE[-1]!r}")
        return value

    @field_validator("handler", "initializer", "preStop")
    @classmethod
    def _check_ref(cls, v: str | None) -> str | None:
        if v is not None and not (_HANDLER_RE.match(v) or _JAVA_HOOK_RE.match(v)):
            raise ValueError("must be 'module.function', e.g. 'echo.handler' (Java: 'package.Class::method')")
        return v

    @model_validator(mode="after")
    def _check_handler(self) -> FunctionSpec:
        """The reference's form for the runtime (the field check above accepts both languages')."""
        java = self.is_java
        for field in ("handler", "initializer", "preStop"):
            value = getattr(self, field)
            if value is None:
                continue
            if java and not (_JAVA_HANDLER_RE if field == "handler" else _JAVA_HOOK_RE).match(value):
                raise ValueError(f"field {field!r}: must be 'package.Class::method', e.g. "
                                 "'org.yuanrong.demo.Demo::handler'")
            if not java and not (_HANDLER_RE.match(value) or (field == "handler" and _MODULE_RE.match(value))):
                raise ValueError(f"field {field!r}: must be 'module.function', e.g. 'echo.handler'")
        return self

    @property
    def is_java(self) -> bool:
        return self.runtime in JAVA_RUNTIMES

    @field_validator("tenant", "namespace", "version")
    @classmethod
    def _check_ident(cls, v: str) -> str:
        if not _IDENT_RE.match(v):
            raise ValueError("must use letters, digits, '_' and '-' (at most 63)")
        return v

    @model_validator(mode="after")
    def _check_aliases(self) -> FunctionSpec:
        for alias, target in self.modelAliases.items():
            if not alias or not target:
                raise ValueError("modelAliases: aliases and the models they name must be non-empty")
            if alias in self.models:
                raise ValueError(f"modelAliases: {alias!r} is already one of the function's models")
            if self.models and target not in self.models:
                raise ValueError(f"modelAliases: {alias!r} names {target!r}, which is not in models "
                                 f"({', '.join(self.models)})")
        return self

    def served_models(self) -> dict[str, str]:
        """Every model name the OpenAI routes accept -> the model the function is asked for.

        With no `models`, the function's own name stands for its model (and any name is accepted)."""
        own = {m: m for m in self.models} if self.models else {self.name: self.name}
        return {**own, **self.modelAliases}

    @field_validator("environment", mode="before")
    @classmethod
    def _stringify_env(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): ("" if val is None else str(val)) for k, val in v.items()}
        return v

    @model_validator(mode="after")
    def _check_instances(self) -> FunctionSpec:
        if self.instances is not None and (self.minInstances is not None or self.maxInstances is not None):
            raise ValueError("field 'instances' is a fixed count: give it, or minInstances/maxInstances, not both")
        if self.minInstances is not None and self.maxInstances is not None and self.minInstances > self.maxInstances:
            raise ValueError("field 'minInstances' must not exceed 'maxInstances'")
        return self

    @property
    def urn(self) -> str:
        return function_urn(self.tenant, self.namespace, self.name, self.version)

    def record(self) -> dict[str, Any]:
        """The fields the deployer set, as JSON: the form stored and shared between nodes, so a
        restored spec sets what was set and no more (a default is not read as a choice)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def public(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["urn"] = self.urn
        return data


def function_urn(tenant: str, namespace: str, name: str, version: str = "latest") -> str:
    return f"sn:cn:yrk:{tenant}:function:0@{namespace}@{name}:{version}"


def _field_errors(exc: ValidationError) -> list[str]:
    out = []
    for e in exc.errors():
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if not e["loc"]:  # a check of the whole function: its message names the field itself
            out.append(str(msg).removeprefix("Value error, "))
            continue
        field = ".".join(str(p) for p in e["loc"])
        out.append(f"field {field!r}: {msg}")
    return out


def parse_manifest(text: str, source: str, base_dir: Path) -> list[FunctionSpec]:
    """Parse manifest text; relative `codePath`s are resolved against `base_dir`.

    Raises ManifestError listing every problem in the document; returns nothing partial.
    """
    try:
        doc = load_untrusted(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not valid YAML/JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise ManifestError(f"{source}: not an acceptable manifest: {exc}") from None
    if isinstance(doc, dict) and "functions" in doc and len(doc) == 1:
        doc = doc["functions"]
    items = doc if isinstance(doc, list) else [doc]
    if not items or not all(isinstance(i, dict) for i in items):
        raise ManifestError(f"{source}: expected a function (a mapping) or a list of functions")
    problems: list[str] = []
    specs: list[FunctionSpec] = []
    for index, item in enumerate(items):
        label = f"{source}: function #{index + 1}" + (f" ({item['name']})" if isinstance(item.get("name"), str) else "")
        try:
            spec = FunctionSpec.model_validate(item)
        except ValidationError as exc:
            problems.extend(f"{label}: {p}" for p in _field_errors(exc))
            continue
        specs.append(spec.model_copy(update={"codePath": (base_dir / spec.codePath).resolve()}))
    names = [s.name for s in specs]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{source}: field 'name': {dup!r} is defined more than once")
    if problems:
        raise ManifestError("\n".join(problems))
    return specs


def load_manifest_file(path: Path) -> list[FunctionSpec]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_manifest(text, str(path), path.resolve().parent)


def load_deploy_dir(directory: Path) -> list[FunctionSpec]:
    """Load every *.yaml/*.yml/*.json manifest; on any bad file, raise listing all bad files."""
    if not directory.is_dir():
        raise ManifestError(f"deploy directory {directory} does not exist")
    specs: list[FunctionSpec] = []
    problems: list[str] = []
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    for path in files:
        try:
            specs.extend(load_manifest_file(path))
        except ManifestError as exc:
            problems.append(exc.message)
    names = [s.name for s in specs]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{directory}: function {dup!r} is defined in more than one manifest")
    if problems:
        raise ManifestError("bad manifests in " + str(directory) + ":\n" + "\n".join(problems))
    return specs
