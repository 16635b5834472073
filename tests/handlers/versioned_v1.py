import time


def handler(event, context):
    time.sleep(event.get("hold", 0))
    return "v1"
