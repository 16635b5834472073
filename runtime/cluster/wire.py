"""The cluster's wire: every message nodes exchange through Redis, typed, with its protocol version.

Each message is built by one `encode_*` function and read by one `decode_*` function here, so no
module parses a message's fields on its own. A message a node will not read raises `WireError`:
malformed (a field missing or of the wrong shape), or of another protocol version
(`ProtocolMismatch`, which names both versions). Its reader logs it and goes on; nothing is misread.

`PROTOCOL` is this node's version. A message without one comes from a node from before versions
were written: that dialect is protocol 1 (this one), with the fallbacks the readers keep for it
(a heartbeat without `answers`, a data entry without `i`, an ack without `ackc`). A node of another
version is refused: its queue entries are not run (acked, dropped, answered with the refusal), its
output and answers fail their invocation, its heartbeat does not count as a live worker, its
registry records are neither applied nor overwritten. One cluster (one `cluster.keyPrefix`) runs
one protocol version; a rolling upgrade across versions uses a new prefix.

- `Call`, frontend -> worker: an entry of the queue stream `{queue:NAME}`; version in field `p`.
- output `data` / `result` / `error`, worker -> frontend: entries of `{inv:ID}:out`; the first
  entry a worker writes names it (`w`) and its version (`p`).
- answer, worker -> frontend: a terminal entry with the invocation's `id` on `{answers:NODE}`
  (with `w` and `p`).
- heartbeat, worker -> every node: the JSON value of `worker:ID`; version in `protocol`.
- registry record, any node -> every node: JSON in the hash `{registry}:functions`; `protocol`.
- cancel, frontend -> workers and frontend -> frontends: pub/sub, the bare invocation id (the
  form of protocol 1; a JSON object is of a later form, refused).

(Stream field values are strings. `v` in a data entry is its values flags, not a version.) Acks
(`{inv:ID}:ack`, `:ackc`) are integers, read by `decode_ack`; the registry channel's message only
wakes the sync (its content is not read).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from runtime.errors import FunctionServiceError
from runtime.surface import Mode

__all__ = ("PROTOCOL", "WireError", "ProtocolMismatch", "Call", "Data", "Terminal", "Record",
           "encode_call", "decode_call", "call_id", "origin", "data_entry", "result_entry", "error_entry",
           "decode_output", "entry_kind", "answer_of", "encode_heartbeat", "decode_heartbeat", "encode_record",
           "decode_record", "decode_cancel", "decode_ack")

PROTOCOL = 1
_P = str(PROTOCOL)
_MODES = get_args(Mode)
_MAX_ID = 256  # characters of an invocation id in a cancel message, at most


class WireError(FunctionServiceError):
    """A message this node does not read: malformed, or of another protocol version."""

    code, status = 200500, 502


class ProtocolMismatch(WireError):
    """A message of a node of another protocol version."""

    def __init__(self, what: str, version: int) -> None:
        super().__init__(f"{what} is of cluster protocol {version}; this node speaks protocol {PROTOCOL} "
                         "(one cluster runs one protocol version: see docs/cluster.md)")
        self.version = version


def _check_version(what: str, value: object) -> None:
    """Refuse a message of another version (absent: a node from before versions, protocol 1)."""
    if value is None or value in (_P, PROTOCOL):
        return
    if isinstance(value, int) and not isinstance(value, bool):
        raise ProtocolMismatch(what, value)
    if isinstance(value, str) and value.isdigit():
        raise ProtocolMismatch(what, int(value))
    raise WireError(f"{what} names no valid protocol version ({value!r})")


def _json_object(what: str, text: str | bytes) -> dict[str, Any]:
    """The JSON object `text` holds (WireError naming `what` for anything else)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise WireError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise WireError(f"{what} is not a JSON object")
    return value


def _int(what: str, fields: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = fields.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise WireError(f"{what}: field {name!r} is not an integer ({text[:40]!r})") from None


# -- the queue entry: one invocation, frontend -> worker ------------------------------------------
@dataclass(frozen=True, slots=True)
class Call:
    """One queued invocation, as a worker reads it."""

    id: str
    function: str            # its function_key (tenant and name)
    event: Any
    mode: Mode
    trace: str | None
    deadline: float          # time.time() after which it is not run; inf when the entry names none
    buffer: int              # the output channel's bound: events, bytes (None: unbounded in bytes)
    buffer_bytes: int | None
    max_write: int
    max_response: int
    items: bool              # keep_items: say which writes carry a JSON value (`v` of a data entry)
    reply: str | None        # the frontend's answers stream for a JSON call's answer, if any


def encode_call(inv_id: str, function: str, event_json: str, *, mode: str, trace: str, deadline: float,
                buffer: int, max_write: int, max_response: int, buffer_bytes: int | None, items: bool,
                reply: str | None) -> tuple[str | int, ...]:
    """The queue entry's field/value pairs (XADD's arguments after the id)."""
    entry: tuple[str | int, ...] = (
        "id", inv_id, "function", function, "event", event_json, "mode", mode, "trace", trace,
        "deadline", repr(deadline), "buffer", buffer, "maxWrite", max_write, "maxResponse", max_response, "p", _P)
    if buffer_bytes is not None:
        entry += ("bufferBytes", buffer_bytes)
    if items:
        entry += ("items", "1")
    if reply is not None:
        entry += ("reply", reply)
    return entry


def call_id(entry_id: str, fields: Mapping[str, str]) -> str:
    """The invocation a queue entry names, without reading the rest (of an entry about to be reclaimed,
    or refused)."""
    return fields.get("id") or entry_id


def decode_call(entry_id: str, fields: Mapping[str, str]) -> Call:
    """A queue entry as the Call it carries (WireError: not one to run)."""
    what = f"queue entry {entry_id}"
    _check_version(what, fields.get("p"))
    try:
        deadline = float(fields.get("deadline") or "inf")
    except ValueError:
        raise WireError(f"{what}: its deadline is not a number ({fields['deadline'][:40]!r})") from None
    if math.isnan(deadline):
        raise WireError(f"{what}: its deadline is not a number")
    try:
        event = json.loads(fields.get("event", "{}"))
    except ValueError as exc:
        raise WireError(f"{what}: its event is not JSON ({exc})") from None
    mode = fields.get("mode")
    buffer = _int(what, fields, "buffer", 100)
    max_write = _int(what, fields, "maxWrite", 4 * 1024 * 1024)
    max_response = _int(what, fields, "maxResponse", 6 * 1024 * 1024)
    assert buffer is not None and max_write is not None and max_response is not None
    return Call(id=call_id(entry_id, fields), function=fields.get("function", ""), event=event,
                mode=next((m for m in _MODES if m == mode), "json"), trace=fields.get("trace"), deadline=deadline,
                buffer=buffer, buffer_bytes=_int(what, fields, "bufferBytes", None), max_write=max_write,
                max_response=max_response, items=fields.get("items") == "1", reply=fields.get("reply"))


# -- output and answers: worker -> frontend -------------------------------------------------------
def origin(worker_id: str) -> dict[str, str]:
    """What rides on the first entry a worker writes for an invocation: who runs it, and its version."""
    return {"w": worker_id, "p": _P}


def data_entry(first: dict[str, str], index: int, lengths: list[int], payloads: list[str],
               values: str | None) -> dict[str, str]:
    """A batch of stream writes: `d` the payloads end to end, `n` their `lengths`, `i` the first's index,
    `v` (a keep_items call's) per payload `j` if its item was the JSON value of its text, `s` if the text."""
    entry = {"t": "data", **first, "i": str(index), "n": ",".join(map(str, lengths)), "d": "".join(payloads)}
    if values is not None:
        entry["v"] = values
    return entry


def result_entry(text: str | None) -> dict[str, str]:
    return {"t": "result", "d": text or ""}


def error_entry(exc: FunctionServiceError) -> dict[str, str]:
    return {"t": "error", "code": str(exc.code), "status": str(exc.status), "message": exc.message}


def entry_kind(fields: Mapping[str, str]) -> str | None:
    """What an output entry is (`data`, `result`, `error`), without reading it: enough for a worker
    that reclaims a call (had it begun? ended?) and for the answers reader's look into a call's stream."""
    return fields.get("t")


def answer_of(fields: Mapping[str, str]) -> str:
    """The invocation an entry of a frontend's answers stream answers ("" when it names none)."""
    return fields.get("id", "")


@dataclass(slots=True)
class Data:
    """A data entry, read: `lengths` of the payloads in `payloads`; `index` of the first (None: an
    old worker's entry, which names none); `values` as data_entry says."""

    worker: str | None
    index: int | None
    lengths: list[int]
    payloads: str
    values: str | None


@dataclass(slots=True)
class Terminal:
    """A `result` (its encoded answer `text`, None for none) or an `error` (`error`)."""

    worker: str | None
    text: str | None
    error: FunctionServiceError | None


def decode_output(fields: Mapping[str, str]) -> Data | Terminal:
    """An output or answer entry (WireError: malformed, or from a worker of another version)."""
    worker = fields.get("w")
    if worker is not None:   # the first entry of a worker: it names its version (or none: protocol 1)
        _check_version(f"the output of worker {worker}", fields.get("p"))
    kind = fields.get("t")
    if kind == "data":
        payloads, lengths = fields.get("d"), fields.get("n")
        if payloads is None or lengths is None:
            raise WireError("a data entry without its payloads or their lengths")
        try:
            sizes = [int(n) for n in lengths.split(",")]
        except ValueError:
            raise WireError(f"a data entry's lengths are not integers ({lengths[:40]!r})") from None
        values = fields.get("v")
        if sum(sizes) != len(payloads) or min(sizes) < 0 or (values is not None and len(values) != len(sizes)):
            raise WireError("a data entry's lengths do not match its payloads")
        return Data(worker, _int("a data entry", fields, "i", None), sizes, payloads, values)
    if kind == "result":
        return Terminal(worker, fields.get("d") or None, None)
    if kind == "error":
        code, status = fields.get("code", ""), fields.get("status", "")
        error = FunctionServiceError(fields.get("message", "invocation failed"),
                                     code=int(code) if code.isdigit() else 200500,
                                     status=int(status) if status.isdigit() and 400 <= int(status) < 600 else 500)
        return Terminal(worker, None, error)
    raise WireError(f"an output entry of no known kind ({str(kind)[:40]!r})")


# -- heartbeats: worker -> every node -------------------------------------------------------------
def encode_heartbeat(running: int, completed: int, functions: list[str]) -> str:
    """`answers`: it puts JSON answers on the frontend's answers stream when the entry names one."""
    return json.dumps({"running": running, "completed": completed, "functions": functions, "answers": 1,
                       "protocol": PROTOCOL})


def decode_heartbeat(worker_id: str, text: str | bytes) -> dict[str, Any]:
    """A worker's heartbeat (its key's value) as /cluster/v1/status shows it."""
    what = f"the heartbeat of worker {worker_id}"
    info = _json_object(what, text)
    _check_version(what, info.get("protocol"))
    functions = info.get("functions", [])
    if not isinstance(functions, list) or not all(isinstance(f, str) for f in functions):
        raise WireError(f"{what} lists its functions as no list of names")
    return info


# -- registry records: any node -> every node -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class Record:
    """One function of the shared registry: its spec (as JSON), the change's version, who stored it."""

    spec: dict[str, Any]
    version: int
    node: str | None
    code_path_rel: str | None


def encode_record(spec: dict[str, Any], version: int, node: str, code_path_rel: str | None) -> str:
    return json.dumps({"spec": spec, "version": version, "node": node, "codePathRel": code_path_rel,
                       "protocol": PROTOCOL})


def decode_record(field: str, text: str | bytes) -> Record:
    what = f"registry record {field!r}"
    rec = _json_object(what, text)
    _check_version(f"{what} (stored by node {rec.get('node')})", rec.get("protocol"))
    spec, version, node, rel = rec.get("spec"), rec.get("version"), rec.get("node"), rec.get("codePathRel")
    if not isinstance(spec, dict):
        raise WireError(f"{what} holds no spec")
    if not isinstance(version, int) or isinstance(version, bool):
        raise WireError(f"{what} has no version number")
    return Record(spec, version, node if isinstance(node, str) else None, rel if isinstance(rel, str) else None)


# -- cancels and acks -----------------------------------------------------------------------------
def decode_cancel(data: str | bytes) -> str:
    """A cancel message: the invocation's id (protocol 1 sends it bare). A JSON object is a message
    of a later form: refused, by its `protocol` when it names one."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    if text.startswith("{"):
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        version = message.get("protocol") if isinstance(message, dict) else None
        if version is not None:
            _check_version("a cancel message", version)
        raise WireError(f"a cancel message is no bare invocation id ({text[:40]!r})")
    if not text or len(text) > _MAX_ID or not text.isprintable() or " " in text:
        raise WireError(f"a cancel message names no invocation id ({text[:40]!r})")
    return text


def decode_ack(events: str | bytes | None, chars: str | bytes | None) -> tuple[int, int | None]:
    """A frontend's acks: events and characters relayed (characters None: an old frontend's, which
    acks events only). A value that is no number is refused (WireError)."""
    try:
        return int(events or 0), None if chars is None else int(chars)
    except ValueError:
        raise WireError(f"an ack is not a number ({events!r}, {chars!r})") from None
