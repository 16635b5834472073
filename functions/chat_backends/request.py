"""Reading and checking an OpenAI request as the `chat` function receives it.

The event is a RunPod-style job, `{"input": {"openai_route": ..., "openai_input": {...}}}`
(the OpenAI routes of the frontend build exactly this); the bare inner object is accepted too.
Checks here are the ones every backend needs; a backend refuses what it cannot do itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import BadRequestError

__all__ = ("OpenAIRequest", "parse_event", "message_text", "CHAT_ROUTE", "COMPLETIONS_ROUTE")

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
_ROUTES = (CHAT_ROUTE, COMPLETIONS_ROUTE)
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_MAX_STOP = 4


@dataclass(frozen=True)
class OpenAIRequest:
    """A checked request; `body` is the original object (what a proxy forwards)."""

    route: str
    body: dict
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    n: int
    messages: tuple[dict, ...] = ()
    prompt: str | list | None = None
    echo: bool = False

    @property
    def chat(self) -> bool:
        return self.route == CHAT_ROUTE


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _optional_int(body: dict, key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < minimum:
        raise BadRequestError(f"'{key}' must be an integer >= {minimum} (got {value!r})")
    return value


def _check_range(body: dict, key: str, low: float, high: float) -> None:
    value = body.get(key)
    if value is not None and (not _is_number(value) or not low <= value <= high):
        raise BadRequestError(f"'{key}' must be a number between {low:g} and {high:g} (got {value!r})")


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (not isinstance(value, list) or len(value) > _MAX_STOP
            or not all(isinstance(s, str) and s for s in value)):
        raise BadRequestError(f"'stop' must be a non-empty string or a list of at most {_MAX_STOP} of them")
    return tuple(value)


def message_text(message: dict) -> str:
    """The text of a message: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _check_messages(value: Any) -> tuple[dict, ...]:
    if value is None:
        raise BadRequestError("missing required parameter 'messages'")
    if not isinstance(value, list) or not value:
        raise BadRequestError("'messages' must be a non-empty list of {role, content} objects")
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequestError(f"'{where}' must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in _ROLES:
            raise BadRequestError(f"'{where}.role' must be one of {', '.join(_ROLES)} (got {role!r})")
        content = message.get("content")
        if content is None and role == "assistant":
            continue  # an assistant turn that only called tools
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequestError(f"'{where}.content[{j}]' must be an object with a 'type'")
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise BadRequestError(f"'{where}.content[{j}].text' must be a string")
        elif not isinstance(content, str):
            raise BadRequestError(f"'{where}.content' must be a string or a list of content parts")
    return tuple(value)


def _check_prompt(value: Any) -> str | list:
    if value is None:
        raise BadRequestError("missing required parameter 'prompt'")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        return value
    raise BadRequestError("'prompt' must be a string or a non-empty list of strings")


def _unwrap(event: Any) -> tuple[str, dict]:
    job = event.get("input", event) if isinstance(event, dict) else None
    if not isinstance(job, dict):
        raise BadRequestError('expected {"input": {"openai_route": ..., "openai_input": {...}}}')
    route = job.get("openai_route")
    if route not in _ROUTES:
        raise BadRequestError(f"'openai_route' must be one of {', '.join(_ROUTES)} (got {route!r})")
    body = job.get("openai_input")
    if not isinstance(body, dict):
        raise BadRequestError("'openai_input' must be an object: the OpenAI request body")
    return route, body


def parse_event(event: Any) -> OpenAIRequest:
    """Check the event and the OpenAI request in it; BadRequestError (400) says what is wrong."""
    route, body = _unwrap(event)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("missing required parameter 'model' (a string)")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError(f"'stream' must be true or false (got {stream!r})")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise BadRequestError("'stream_options' is only allowed when 'stream' is true")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise BadRequestError("'stream_options' must be an object like {\"include_usage\": true}")
        include_usage = options.get("include_usage", False)
    max_tokens = _optional_int(body, "max_tokens", 1)
    if route == CHAT_ROUTE:
        max_tokens = _optional_int(body, "max_completion_tokens", 1) or max_tokens
    n = _optional_int(body, "n", 1) or 1
    _check_range(body, "temperature", 0, 2)
    _check_range(body, "top_p", 0, 1)
    _check_range(body, "presence_penalty", -2, 2)
    _check_range(body, "frequency_penalty", -2, 2)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequestError(f"'seed' must be an integer (got {seed!r})")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequestError("'user' must be a string")
    common = dict(route=route, body=body, model=model, stream=stream, include_usage=include_usage,
                  max_tokens=max_tokens, stop=_stop(body), seed=seed, n=n)
    if route == CHAT_ROUTE:
        return OpenAIRequest(**common, messages=_check_messages(body.get("messages")))
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequestError("'echo' must be true or false")
    return OpenAIRequest(**common, prompt=_check_prompt(body.get("prompt")), echo=echo)
