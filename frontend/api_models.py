"""Pydantic models of the JSON the routes answer, for the OpenAPI document (frontend/openapi.py).

Request models come from the code where it has them (FunctionSpec for manifests, StreamStats for
stream statistics); the answer shapes the routes build as dicts are described here, with the
code's own types inside (StreamStats).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.streams import StreamStats

__all__ = ("ErrorBody", "OpenAIError", "OpenAIErrorBody", "Health", "FunctionStatus", "FunctionInfo", "FunctionList",
           "FunctionOne", "Deployed", "Deleted", "PublishResult", "StreamList", "StreamDeleted",
           "ChatCompletionRequest", "CompletionRequest", "ModelList", "Model", "ClusterStatus")


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


class FunctionInfo(BaseModel):
    """A deployed function: every field of its manifest (FunctionSpec), its URN and its status."""

    model_config = ConfigDict(extra="allow",
                              json_schema_extra={"allOf": [{"$ref": "#/components/schemas/FunctionSpec"}]})
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
