"""Read a named stream until its terminator and return what was read.

An async handler, so it uses the awaitable consumer API. Event keys: `stream` (name),
`terminator` ("[DONE]"), `timeout_ms` (idle wait per receive, 10000), `from_id` (resume after
this id), `max` (stop after this many elements, 10000).
"""
from runtime import SubscriptionConfig


async def handler(event, context):
    event = event if isinstance(event, dict) else {}
    name = event.get("stream", "stream-demo")
    terminator = event.get("terminator", "[DONE]").encode()
    timeout_ms = int(event.get("timeout_ms", 10000))
    limit = int(event.get("max", 10000))
    from_id = event.get("from_id")
    config = SubscriptionConfig(from_id=None if from_id is None else int(from_id))
    read: list[str] = []
    async with await context.acreate_stream_consumer(name, config) as consumer:
        while len(read) < limit:
            batch = await consumer.areceive(timeout_ms)
            if not batch:
                return {"stream": name, "elements": read, "ended": "timeout"}
            for element in batch:
                if element.data == terminator:
                    return {"stream": name, "elements": read, "ended": "terminator", "last_id": element.id}
                read.append(element.data.decode("utf-8", "replace"))
    return {"stream": name, "elements": read, "ended": "max"}
