"""The function templates of `fnstream new`: handler code and manifest text for each kind.

`{name}` is the function's name; handler files are `functions/{module}.py`. Every template's handler
runs on this fnstream as it is (the test suite deploys and invokes each over a real socket).
"""
from __future__ import annotations

from typing import Final

__all__ = ("TEMPLATES", "Template")


class Template:
    """One template: what it is for, its handler source and the extra manifest lines."""

    __slots__ = ("code", "example_data", "java", "manifest_extra", "summary")

    def __init__(self, summary: str, code: str, manifest_extra: str = "", example_data: str = "{}",
                 *, java: bool = False) -> None:
        self.summary = summary
        self.code = code
        self.manifest_extra = manifest_extra
        self.example_data = example_data
        self.java = java  # a Java source (`{package}`, `{cls}`): functions/<module>/<module>/<Class>.java


_PLAIN = '''"""{name}: a plain function; its return value is the JSON response."""


def handler(event, context):
    who = event.get("name", "world") if isinstance(event, dict) else "world"
    return {{"greeting": f"hello, {{who}}", "function": context.getFunctionName()}}
'''

_STREAM = '''"""{name}: openYuanrong's streaming pattern — each context.get_stream().write() reaches an SSE
client at once (Accept: text/event-stream); the return value is the last event."""
import json
import time


def handler(event, context):
    count = int(event.get("count", 3)) if isinstance(event, dict) else 3
    stream = context.get_stream()
    for i in range(1, count + 1):
        stream.write(json.dumps({{"event": "this is a stream", "n": i}}))
        time.sleep(0.2)
    return "ok"
'''

_GENERATOR = '''"""{name}: an async generator — every `yield` is one stream event, sent as it is produced."""
import asyncio


async def handler(event, context):
    count = int(event.get("count", 3)) if isinstance(event, dict) else 3
    for i in range(1, count + 1):
        yield {{"n": i, "of": count}}
        await asyncio.sleep(0.2)
'''

_OPENAI = '''"""{name}: serves POST /v1/chat/completions for the models its manifest lists (`models:`).

The frontend passes the request as `event["input"]["openai_input"]`; with `stream: true` each
`yield` is one chat.completion.chunk, with `stream: false` the one yield is the completion.
Replace `reply()` with your model.
"""
import asyncio
import time


def reply(messages):
    last = messages[-1].get("content", "") if messages else ""
    return f"You said: {{last}}"


def _chunk(model, delta, finish=None):
    return {{"id": "chatcmpl-{name}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [{{"index": 0, "delta": delta, "finish_reason": finish}}]}}


async def handler(event, context):
    request = event["input"]["openai_input"]
    model, text = request["model"], reply(request.get("messages", []))
    if not request.get("stream"):
        yield {{"id": "chatcmpl-{name}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{{"index": 0, "finish_reason": "stop",
                                             "message": {{"role": "assistant", "content": text}}}}]}}
        return
    words = text.split(" ")
    for i, word in enumerate(words):
        delta = {{"role": "assistant", "content": word}} if i == 0 else {{"content": " " + word}}
        yield _chunk(model, delta)
        await asyncio.sleep(0.05)
    yield _chunk(model, {{}}, "stop")
'''

_RUNPOD = '''"""{name}: a RunPod serverless handler — `handler(job)` takes the job ({{"id", "input"}}) and no
context, as on RunPod; each yield is one output item, streamed as it is produced.

As a job (the runpod SDK, endpoint id "{name}", base URL http://HOST:PORT/v2): POST
{{"input": {{"prompt": "..."}}}} to /v2/{name}/run, then read /v2/{name}/stream/ID or /status/ID
(the output is the list of items). Invoked directly, the same body streams over SSE.
"""
import time


def handler(job):
    job_input = job.get("input") or {{}}
    prompt = str(job_input.get("prompt", "hello from runpod"))
    for word in prompt.split():
        yield {{"word": word}}
        time.sleep(0.1)
'''

_PROCESS = '''"""{name}: CPU-bound work in worker processes (`executor: process`), off the server's loop
and GIL; stream writes still reach the client as they happen."""


def _is_prime(k):
    return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))


def handler(event, context):
    limit = int(event.get("limit", 20000)) if isinstance(event, dict) else 20000
    step = max(limit // 4, 1)
    found = 0
    for start in range(0, limit, step):
        end = min(start + step, limit)
        found += sum(1 for k in range(start, end) if _is_prime(k))
        context.get_stream().write({{"below": end, "primes": found}})
    return {{"primes": found}}
'''

_JAVA = '''package {package};

import com.google.gson.JsonObject;
import org.yuanrong.services.runtime.Context;
import org.yuanrong.services.runtime.action.Stream;

/**
 * {name}: openYuanrong's Java streaming pattern. Each context.getStream().write() reaches an SSE
 * client at once (Accept: text/event-stream); the return value is the last event. No build tool:
 * fnstream compiles this file at deploy (JDK 17 or later, gson).
 */
public class {cls} {{
    public JsonObject handler(JsonObject event, Context context) throws InterruptedException {{
        int count = event != null && event.has("count") ? event.get("count").getAsInt() : 3;
        Stream stream = context.getStream();
        for (int n = 1; n <= count; n++) {{
            JsonObject step = new JsonObject();
            step.addProperty("event", "this is a stream");
            step.addProperty("n", n);
            stream.write(step);
            Thread.sleep(100);
        }}
        JsonObject result = new JsonObject();
        result.addProperty("count", count);
        result.addProperty("function", context.getFunctionName());
        return result;
    }}
}}
'''

TEMPLATES: Final[dict[str, Template]] = {
    "plain": Template("returns JSON", _PLAIN, example_data='{"name": "you"}'),
    "stream": Template("context.get_stream().write() events (openYuanrong)", _STREAM, example_data='{"count": 3}'),
    "generator": Template("async generator, one event per yield", _GENERATOR, example_data='{"count": 3}'),
    "openai": Template("OpenAI chat completions chunks on /v1/chat/completions", _OPENAI,
                       "models: [{name}]\n"
                       "# modelAliases: {{gpt-4o-mini: {name}}}   # answer clients that pin OpenAI names\n"),
    "runpod": Template("RunPod serverless handler(job), a generator over the job input", _RUNPOD,
                       example_data='{"input": {"prompt": "streams word by word"}}'),
    "process": Template("CPU-bound work in worker processes", _PROCESS, "executor: process\ninstances: 2\n",
                        example_data='{"limit": 20000}'),
    "java": Template("a Java handler (openYuanrong's SDK), compiled at deploy", _JAVA,
                     "runtime: java17\nminInstances: 0   # a worker JVM starts on demand\n",
                     example_data='{"count": 3}', java=True),
}
