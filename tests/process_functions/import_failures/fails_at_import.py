"""A module whose import raises ImportError."""
import fnstream_no_such_module  # noqa: F401


def handler(event, context):
    return "unreachable"
