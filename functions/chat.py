"""The bundled `chat` function: OpenAI chat and completions from an ordinary handler.

Its event is a RunPod-style job, `{"input": {"openai_route": "/v1/chat/completions",
"openai_input": {...}}}`, whether it comes from the frontend's `/v1/...` routes or from the
function-service route. With `stream: true` it yields one OpenAI chunk object per item; with
`stream: false`, one completion object. The manifest's `environment.backend` picks the model:
`standin` (default) or `upstream` (any OpenAI-compatible server).
"""
from contextlib import aclosing

from chat_backends import StandinSettings, UpstreamSettings, generate, parse_event, relay

from runtime.errors import FunctionServiceError


async def handler(event, context):
    req = parse_event(event)
    env = context.environment
    backend = env.get("backend", "standin")
    if backend == "standin":
        items = generate(req, StandinSettings(env))
    elif backend == "upstream":
        items = relay(req, UpstreamSettings(env), trace_id=context.get_trace_id())
    else:
        raise FunctionServiceError(f"chat function: environment 'backend' must be standin or upstream "
                                   f"(got {backend!r})")
    async with aclosing(items):  # the upstream connection closes as soon as we stop
        async for item in items:
            yield item
