"""Pydantic models of the JSON the routes answer, for the OpenAPI document (frontend/openapi.py).

Request models come from the code where it has them (FunctionSpec for manifests, StreamStats for
stream statistics); the answer shapes the routes build as dicts are described here, with the
code's own types inside (StreamStats).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.jobs.model import Api, Status
from runtime.streams import StreamStats

__all__ = ("ErrorBody", "OpenAIError", "OpenAIErrorBody", "Health", "FunctionStatus", "FunctionInfo", "FunctionList",
           "FunctionOne", "Deployed", "Deleted", "PublishResult", "StreamList", "StreamDeleted", "SessionInfo",
           "SessionInterrupted", "SessionEnded",
           "ChatCompletionRequest", "CompletionRequest", "ModelList", "Model", "ClusterStatus", "JobInfo", "JobList",
           "AsyncAccepted", "AsyncResult", "RunpodErrorBody", "RunpodPolicy", "RunpodRequest", "RunpodQueued",
           "RunpodStatus", "RunpodStream", "RunpodPurged", "RunpodHealth")


class ErrorBody(BaseModel):
    """Every function-service error (X-Inner-Code carries `code` too)."""

    code: int = Field(description="fnstream / openYuanrong error code, e.g. 150424 function not found")
    message: str
    trace_id: str | None = None


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class OpenAIErrorBody(BaseModel):
    """Errors of the OpenAI-compatible routes (`/v1/...`), as the openai SDKs parse them."""

    error: OpenAIError


class Health(BaseModel):
    status: Literal["ok"]
    functions: int
    auth: bool = Field(description="whether the server wants a token (the console asks for one)")


class FunctionStatus(BaseModel):
    revision: int
    kind: str = Field(description="sync, async, gen or asyncgen")
    inflight: int
    invocations: int
    failures: int
    initError: str | None = None
    executor: str
    pool: dict[str, Any] | None = Field(None, description="executor: process — worker processes")
    sessions: list[SessionInfo] = Field(default_factory=list, description="live X-Instance-Sessions")


class SessionInfo(BaseModel):
    """One live X-Instance-Session (runtime/sessions.py Session.describe)."""

    sessionID: str
    sessionTTL: float
    concurrency: int = Field(description="turns at once; -1 = exclusive use of the instance")
    running: int
    turns: int
    pid: int | None = Field(description="the worker it is pinned to (executor: process), else None")
    idleSeconds: float
    ageSeconds: float = Field(description="since the session was opened")
    expiresInSeconds: float | None = Field(description="until it ends if unused (None while a turn runs)")


class SessionInterrupted(BaseModel):
    code: int = 0
    message: str = "SUCCESS"
    sessionID: str
    interrupted: int = Field(description="how many running invocations of the session were stopped")


class SessionEnded(BaseModel):
    code: int = 0
    message: str = "SUCCESS"
    sessionID: str
    running: int = Field(description="invocations of the session still running (they finish)")


class FunctionInfo(BaseModel):
    """A deployed function: every field of its manifest (FunctionSpec), its URN and its status."""

    model_config = ConfigDict(extra="allow",
                              json_schema_extra={"allOf": [{"$ref": "#/components/schemas/FunctionFields"}]})
    name: str
    urn: str
    status: FunctionStatus


class FunctionList(BaseModel):
    functions: list[FunctionInfo]


class FunctionOne(BaseModel):
    function: FunctionInfo


class Deployed(BaseModel):
    code: int = 0
    message: str = "SUCCESS"
    function: FunctionInfo
    functions: list[FunctionInfo]


class Deleted(BaseModel):
    code: int = 0
    message: str = "deleted"
    function: dict[str, Any]


class PublishResult(BaseModel):
    stream: str
    ids: list[int] = Field(description="sequence ids given to the elements, in order")
    stats: StreamStats


class StreamList(BaseModel):
    streams: list[StreamStats]


class StreamDeleted(BaseModel):
    code: int = 0
    message: str = "SUCCESS"
    deleted: str


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat request; fields beyond these are passed to the serving function as sent."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[dict[str, Any]]
    stream: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str | list[str]
    stream: bool = False


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ClusterStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    cluster: bool


# -- jobs (runtime/jobs/model.py builds these views) -------------------------------------------
class JobInfo(BaseModel):
    """fnstream's view of a job (its output items are on /events)."""

    id: str
    function: str
    tenant: str
    status: Status
    api: Api = Field(description="the API that submitted it")
    createdAt: str | None = Field(description="RFC 3339")
    startedAt: str | None
    completedAt: str | None
    delayTime: int = Field(description="ms queued")
    executionTime: int = Field(description="ms running")
    outputCount: int
    outputBytes: int
    result: Any = Field(None, description="what a plain JSON invoke would have answered")
    error: dict[str, Any] | None = Field(None, description="{code, message}")
    statusCode: int | None = None
    retries: int = 0


class JobList(BaseModel):
    jobs: list[JobInfo] = Field(description="this tenant's jobs on this node, newest first")


class AsyncAccepted(BaseModel):
    """openYuanrong's answer to `X-Invoke-Type: async` (also in the X-Async-Request-Id header)."""

    requestId: str


class AsyncResult(BaseModel):
    requestId: str
    status: Literal["pending", "running", "completed", "failed", "cancelled"]
    statusCode: int | None = Field(None, description="once finished: the sync call's HTTP status")
    respBody: Any = Field(None, description="once finished: the sync call's JSON answer, or its error")


class RunpodErrorBody(BaseModel):
    """Errors of RunPod's routes (`/v2/{fn}/...`), as the runpod SDK reads them."""

    error: str


class RunpodPolicy(BaseModel):
    executionTimeout: int | None = Field(None, description="ms; shortens the function's timeout")
    ttl: int | None = Field(None, description="ms the job may wait in the queue")


class RunpodRequest(BaseModel):
    input: Any = Field(description="the handler's event is {id: JOB_ID, input}")
    webhook: str | None = Field(None, description="POSTed the status object when the job ends")
    policy: RunpodPolicy | None = None


class RunpodQueued(BaseModel):
    id: str
    status: Status


class RunpodStatus(BaseModel):
    id: str
    status: Status
    delayTime: int
    executionTime: int
    output: Any = Field(None, description="once COMPLETED")
    error: str | None = Field(None, description="once FAILED, TIMED_OUT or CANCELLED")
    retries: int | None = None


class RunpodStream(BaseModel):
    id: str
    status: Status
    stream: list[dict[str, Any]] = Field(description="[{output: item}, ...]: the items not returned before")


class RunpodPurged(BaseModel):
    removed: int
    status: Literal["completed"] = "completed"


class RunpodHealth(BaseModel):
    jobs: dict[str, int] = Field(description="completed, failed, inProgress, inQueue, retried, cancelled")
    workers: dict[str, int] = Field(description="idle and running concurrency slots of the function here")
