"""A module whose import takes a while (as any import does on a busy host), longer than its
function's `timeout` in the test that deploys it."""
import os
import time

time.sleep(0.5)


def handler(event, context):
    return {"pid": os.getpid()}
