"""openYuanrong's streaming example, exactly: one stream event, then the result 'ok'."""
import json


def handler(event, context):
    data = {"event": "this is a stream"}
    context.get_stream().write(json.dumps(data))
    return 'ok'
