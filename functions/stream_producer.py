"""openYuanrong's data-stream example: produce `count` elements into a named stream, then the terminator.

A plain `def` handler, so it uses the blocking producer API from its worker thread. Event keys:
`stream` (name), `count` (5), `delay_ms` between elements (0), `terminator` ("[DONE]"),
`retain_num` (0: subscribe before producing, as in openYuanrong).
"""
import json
import time

from runtime import ProducerConfig


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    name = event.get("stream", "stream-demo")
    count = int(event.get("count", 5))
    delay = float(event.get("delay_ms", 0)) / 1000
    terminator = event.get("terminator", "[DONE]")
    config = ProducerConfig(retain_num=int(event.get("retain_num", 0)), terminator=terminator)
    with context.create_stream_producer(name, config) as producer:
        for i in range(1, count + 1):
            if i > 1 and delay > 0:
                time.sleep(delay)
            producer.send(json.dumps({"seq": i, "of": count}).encode())
        producer.send(terminator.encode())
    return {"stream": name, "sent": count, "terminator": terminator}
