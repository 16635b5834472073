"""Handlers used by the tests (deployed from manifests the tests write)."""
import asyncio
import time

# Observable side effects: tests read these through the module (same process, in-process client).
STATE = {"log": [], "writes": {}}


async def echo_async(event, context):
    return event


def echo_sync(event, context):
    return event


def raise_early(event, context):
    raise ValueError("bad input: no widgets")


def raise_mid(event, context):
    context.get_stream().write("first")
    context.get_stream().write("second")
    raise RuntimeError("boom after two events")


def exits(event, context):
    import sys
    sys.exit(3)


class _OwnBaseException(BaseException):
    """Not an Exception: user code may still raise it."""


async def raises_base_exception(event, context):
    raise _OwnBaseException("not an Exception")


def returns_none(event, context):
    context.get_stream().write("only")


def not_serializable(event, context):
    return {1, 2, 3}


def multiline(event, context):
    context.get_stream().write("line one\nline two\r\nline three")
    return None


def gen(event, context):
    for i in range(int(event.get("n", 3))):
        yield {"i": i}


async def agen(event, context):
    for i in range(int(event.get("n", 3))):
        await asyncio.sleep(float(event.get("delay", 0)))
        yield f"item-{i}"


def sync_ticker(event, context):
    """A thread handler that writes `count` events `delay_ms` apart."""
    for i in range(int(event.get("count", 5))):
        if i:
            time.sleep(event.get("delay_ms", 200) / 1000)
        context.get_stream().write({"tick": i + 1})
    return "done"


def sync_forever(event, context):
    """Writes until its stream is closed (client gone or timed out), then records that."""
    from runtime import StreamClosedError
    marker = event.get("marker", "default")
    try:
        while True:
            context.get_stream().write("x" * int(event.get("size", 10)))
            time.sleep(event.get("sleep", 0.01))
    except StreamClosedError:
        STATE["log"].append(("stopped", marker))
        raise


async def async_forever(event, context):
    marker = event.get("marker", "default")
    STATE["writes"][marker] = 0
    try:
        while True:
            await context.get_stream().write("y" * int(event.get("size", 10)))
            STATE["writes"][marker] += 1
            await asyncio.sleep(event.get("sleep", 0.01))
    except asyncio.CancelledError:
        STATE["log"].append(("cancelled", marker))
        raise


async def async_sleep(event, context):
    await asyncio.sleep(event.get("seconds", 10))
    return "woke"


def sync_sleep(event, context):
    time.sleep(event.get("seconds", 10))
    return "woke"


def stubborn_sleep_then_write(event, context):
    """Swallows what stops its thread at the timeout (a bare except), sleeps on, then writes: its
    late write must be refused. (The next stop comes a second later, after the write.)"""
    end = time.monotonic() + float(event.get("seconds", 1))
    while True:
        try:
            while time.monotonic() < end:
                time.sleep(0.01)
            break
        except BaseException:  # the mistake under test
            STATE["log"].append(("stopped",))
    try:
        context.get_stream().write("late")
    except Exception as exc:
        STATE["log"].append(("late-write", type(exc).__name__))
        raise
    return "wrote"


def big_write(event, context):
    context.get_stream().write("z" * int(event["size"]))
    return "ok"


def context_info(event, context):
    return {
        "request_id": context.getRequestID(),
        "trace_id": context.get_trace_id(),
        "invoke_id": context.get_invoke_id(),
        "name": context.getFunctionName(),
        "version": context.getVersion(),
        "tenant": context.getTenantID(),
        "greeting": context.getUserData("GREETING"),
        "missing": context.get_user_data("NOPE", "fallback"),
        "remaining_ms": context.getRemainingTimeInMilliSeconds(),
        "running_s": context.getRunningTimeInSeconds(),
        "logger": context.getLogger().name,
    }


INIT_CALLS = []


def init_ok(context):
    INIT_CALLS.append(context.getFunctionName())


def init_fail(context):
    raise RuntimeError("cannot reach the database")


def counted(event, context):
    return {"init_calls": INIT_CALLS.count(context.getFunctionName())}


async def async_unawaited_flood(event, context):
    """Writes without awaiting: must be refused once the buffer is full, not grow memory."""
    stream = context.get_stream()
    for i in range(int(event.get("n", 1000))):
        stream.write(str(i))
    return "unreachable"


def self_framed(event, context):
    """Frames its own SSE, as runpod-worker-ollama does (deployed with rawStream: true)."""
    for i in range(int(event.get("count", 4))):
        if i:
            time.sleep(event.get("delay_ms", 200) / 1000)
        yield f'data: {{"n": {i}}}\n\n'
    yield "data: [DONE]\n\n"


async def plain_writes(event, context):
    """A plain JSON call's stream: a JSON write is dropped; one that cannot go out still raises."""
    stream = context.get_stream()
    await stream.write({"dropped": True})
    try:
        await stream.write({1, 2})
    except Exception as exc:
        return {"refused": type(exc).__name__, "invoke_id": context.get_invoke_id(),
                "trace_id": context.get_trace_id(), "remaining_ms": context.getRemainingTimeInMilliSeconds()}
    return {"refused": None}
