"""Handlers for the job tests: RunPod-style (one parameter) and openYuanrong-style (event, context)."""
import asyncio
import json
import os
import time

import yr  # openYuanrong code imports yr unchanged: fnstream's shim when no real yr is installed


def echo(job):
    """RunPod-style: gets the job dict {"id", "input"}."""
    return {"job_id": job.get("id"), "input": job.get("input")}


def count(job):
    """A sync generator: yields `n` items `delay` seconds apart."""
    inp = job["input"]
    for i in range(int(inp.get("n", 3))):
        if i:
            time.sleep(float(inp.get("delay", 0)))
        yield {"i": i, "t": time.time()}


async def acount(job):
    inp = job["input"]
    for i in range(int(inp.get("n", 3))):
        if i:
            await asyncio.sleep(float(inp.get("delay", 0)))
        yield f"token-{i}"


async def ollama_style(job):
    """The shape of runpod-worker-ollama's handler: self-framed SSE strings (rawStream: true)."""
    inp = job["input"]
    words = str(inp.get("prompt", "hi there")).split()
    for word in words:
        await asyncio.sleep(float(inp.get("delay", 0)))
        chunk = {"id": "chatcmpl-job", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


async def sleeper(job):
    await asyncio.sleep(float(job["input"].get("seconds", 1)))
    return "slept"


def sync_sleeper(job):
    time.sleep(float(job["input"].get("seconds", 1)))
    return "slept"


def error_dict(job):
    return {"error": "the input was unusable"}


def yields_error(job):
    yield "fine"
    yield {"error": "went wrong after one item"}
    yield "never"


def raises(job):
    raise ValueError("no widgets")


def big(job):
    for _ in range(int(job["input"].get("n", 10))):
        yield "x" * int(job["input"].get("size", 1000))


def writes_then_returns(event, context):
    """openYuanrong-style: stream writes, then a result (RunPod's job event: the input is under "input")."""
    inp = event.get("input", event)
    for i in range(int(inp.get("n", 2))):
        if i:
            time.sleep(float(inp.get("delay", 0)))
        context.get_stream().write({"n": i})
    return {"ok": True, "got": event}


async def uses_yr(event, context):
    """openYuanrong data-stream API through `import yr`."""
    name = f"job-yr-{context.get_invoke_id()}"
    # positional arguments, as openYuanrong writes them
    consumer = await yr.acreate_stream_consumer(name, yr.SubscriptionConfig("s", yr.SubscriptionType.STREAM))
    producer = await yr.acreate_stream_producer(name, yr.ProducerConfig(0, 4096))  # delay_flush_time, page_size
    await producer.asend(yr.Element(b"hello-yr"))
    got = await consumer.areceive(1000, 1)
    await producer.aclose()
    await consumer.aclose()
    return {"received": [bytes(e.data).decode() for e in got], "shim": getattr(yr, "FNSTREAM_SHIM", False)}



def uses_yr_sync(event, context):
    """docs/yr.md's example: the blocking forms, `yr.stream`, openYuanrong's keyword names."""
    from yr.stream import SubscriptionType

    name = f"job-yr-sync-{context.get_invoke_id()}"
    consumer = yr.create_stream_consumer(name, yr.SubscriptionConfig("sub-a", SubscriptionType.STREAM))
    producer = yr.create_stream_producer(name, yr.ProducerConfig(delay_flush_time=0))
    producer.send(yr.Element(b"42"))
    producer.close()
    elements = consumer.receive(1000, expect_num=1)
    consumer.ack(element_id=elements[-1].id)
    consumer.close()
    return {"data": elements[0].data.decode(), "consumers": yr.query_global_consumers_num(name)}

def marked(job):
    """Appends its job id to the file `mark` (each run leaves a line), then yields `n` items of `size` bytes
    (once the file `gate` exists, when given)."""
    inp = job["input"]
    with open(inp["mark"], "a") as f:
        f.write(f"{job['id']}\n")
    while inp.get("gate") and not os.path.exists(inp["gate"]):  # with `gate`: its items wait for that file
        time.sleep(0.02)
    for _ in range(int(inp.get("n", 1))):
        yield "x" * int(inp.get("size", 10))


def log_ids(job):
    """The invocation id its log lines carry (runtime/logs.py's context), as its output."""
    from runtime.logs import log_context
    return {"invocation_id": log_context()[2]}


def fails_once(job):
    """Counts its runs in the file `input.path` (shared by every node of a test cluster): the first
    one fails, later ones return how many runs there were."""
    path = job["input"]["path"]
    with open(path, "a") as f:
        f.write("run\n")
    with open(path) as f:
        runs = len(f.readlines())
    if runs == 1:
        raise ValueError("the first run fails")
    return {"runs": runs}
