"""A cluster-mode test handler: which trace and which process ran it."""
import os


def handler(event, context):
    return {"trace_id": context.get_trace_id(), "pid": os.getpid()}
