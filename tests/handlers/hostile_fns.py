"""Handlers that write or return what cannot be encoded (lone surrogates, NaN)."""
from runtime.errors import StreamWriteError


def surrogate_writer(event, context):
    """Writes around unencodable text; each refused write is reported as its own event."""
    stream = context.get_stream()
    out = []
    for item in event.get("writes", []):
        value = "\ud800" if item == "SURROGATE" else float("nan") if item == "NAN" else item
        try:
            stream.write(value)
            out.append("ok")
        except StreamWriteError as exc:
            out.append("refused")
            stream.write(f"refused: {type(exc).__name__}")
    return {"results": out}


async def async_surrogate_writer(event, context):
    stream = context.get_stream()
    out = []
    for item in event.get("writes", []):
        value = "\ud800" if item == "SURROGATE" else item
        try:
            await stream.write(value)
            out.append("ok")
        except StreamWriteError:
            out.append("refused")
    return {"results": out}


def bad_result(event, context):
    return {"nan": float("nan")} if event.get("kind") == "nan" else {"text": "\ud800"}


def many_writes(event, context):
    """`count` writes of `size` characters each, as fast as the buffer takes them."""
    stream = context.get_stream()
    for i in range(int(event["count"])):
        stream.write(f"{i:04d}" + "x" * (int(event["size"]) - 4))
    return None
