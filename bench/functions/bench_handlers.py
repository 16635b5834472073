"""The benchmark workload as fnstream handlers; bench/targets/ serve the same contract.

Event: {"count": N, "first_delay_ms": d, "delay_ms": g, "hold_s": h}. Sleep d, write N events
{"i": i} g apart, then keep the stream open h seconds (idle streams) and return None.
"""
import asyncio
import time

__all__ = ("stream_async", "stream_thread", "echo", "echo_async", "fanout_producer", "burn")


def _params(event):
    event = event if isinstance(event, dict) else {}
    return (int(event.get("count", 10)), float(event.get("first_delay_ms", 0)) / 1000,
            float(event.get("delay_ms", 0)) / 1000, float(event.get("hold_s", 0)))


async def stream_async(event, context):
    count, first, delay, hold = _params(event)
    stream = context.get_stream()
    if first:
        await asyncio.sleep(first)
    for i in range(count):
        if i and delay:
            await asyncio.sleep(delay)
        await stream.write({"i": i})
    if hold:
        await asyncio.sleep(hold)


def stream_thread(event, context):
    count, first, delay, hold = _params(event)
    stream = context.get_stream()
    if first:
        time.sleep(first)
    for i in range(count):
        if i and delay:
            time.sleep(delay)
        stream.write({"i": i})
    if hold:
        time.sleep(hold)


def echo(event, context):
    return event


async def echo_async(event, context):
    return event


async def fanout_producer(event, context):
    """Send `count` elements, then the `[DONE]` terminator, into the named stream `stream`.

    Policy `block`: the producer waits for the slowest subscriber instead of cutting it (the
    default `cut` would end subscribers that fall `streams.subscriberBuffer` elements behind).
    """
    from runtime import ProducerConfig

    producer = await context.acreate_stream_producer(event["stream"], ProducerConfig(slow_consumer_policy="block"))
    for i in range(int(event.get("count", 1000))):
        await producer.asend(f'{{"i":{i}}}')
    await producer.asend("[DONE]")
    await producer.aclose()
    return None


def burn(event, context):
    """CPU-bound: `loops` iterations of pure Python (holds the GIL), for bench.cluster's scaling figure."""
    total = 0
    for i in range(int(event.get("loops", 200_000))):
        total += i * i
    return total


def spin(event, context):
    """Never returns: pure Python on a CPU, for bench.runaway (stopped at its timeout)."""
    while True:
        pass
