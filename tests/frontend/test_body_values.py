"""One request body cannot hold the event loop: a body of more values than
`frontend.args.maxBodyValues` (arrays, objects and their elements and members: scalars count) is a
413 in the route's JSON shape before it is parsed (separators inside strings do not count), msgpack
too, and a large body is parsed with the garbage collector paused (frontend/safe_json.py)."""
from __future__ import annotations

import gc
import json

import msgpack
import pytest

from frontend import safe_json
from frontend.routes.streams import parse_elements
from runtime.errors import BodyTooLargeError
from tests.support.servers import FUNCTIONS, test_config

LIMIT = 1000
NESTED = b"[" + b"[]," * LIMIT + b"[]]"  # LIMIT + 2 arrays: the probe's 1.4 M `[]` body, smaller
SCALARS = b"[" + b"1," * LIMIT + b"1]"  # LIMIT + 1 numbers in one array: the probe's 2 M `1` body, smaller
STRINGS = b"[" + b'"",' * LIMIT + b'""]'  # and its 1.4 M `""`
IN_STRINGS = json.dumps({"code": "f(x) { return [x[0], {a: x}]; } \\\" [{" * (LIMIT // 2)}).encode()
MSGPACK = {"Content-Type": "application/x-msgpack"}


@pytest.fixture
async def cclient(make_client, deploy_dir):
    deploy = deploy_dir({"name": "echo", "handler": "echo.handler", "codePath": str(FUNCTIONS)},
                        {"name": "chat", "handler": "chat.handler", "codePath": str(FUNCTIONS), "models": ["m"]})
    return await make_client(test_config(deploy, **{"frontend.args.maxBodyValues": LIMIT}))


async def _refused(resp) -> str:
    assert resp.status == 413, await resp.text()
    body = await resp.json()
    message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("message", str(body))
    assert "frontend.args.maxBodyValues" in message, body
    return message


async def test_too_many_containers_is_413_on_every_json_route(cclient):
    await _refused(await cclient.post("/serverless/v1/functions/echo/invocations", data=NESTED))
    await _refused(await cclient.post("/invocations/default/default/echo/", data=NESTED))
    await _refused(await cclient.post("/v2/echo/run", data=b'{"input": ' + NESTED + b"}"))
    await _refused(await cclient.post("/v2/echo/runsync", data=b'{"input": ' + NESTED + b"}"))
    chat = b'{"model": "m", "messages": [], "x": ' + NESTED + b"}"
    resp = await cclient.post("/v1/chat/completions", data=chat)
    assert (await resp.json())["error"]["type"] == "invalid_request_error"  # OpenAI's shape
    await _refused(resp)
    await _refused(await cclient.post("/serverless/v1/streams/s", data=NESTED))
    await _refused(await cclient.post("/serverless/v1/streams/s", data=NESTED.replace(b",", b"\n")))  # NDJSON
    await _refused(await cclient.post("/serverless/v1/streams/s", data=msgpack.packb([[{}] * 10] * 200),
                                      headers=MSGPACK))


async def test_too_many_scalars_is_413_before_the_parse(cclient):
    """Two containers, LIMIT + 1 numbers (or strings): refused as the containers cap let them through."""
    for values in (SCALARS, STRINGS):
        await _refused(await cclient.post("/v2/echo/run", data=b'{"input": ' + values + b"}"))
        await _refused(await cclient.post("/serverless/v1/functions/echo/invocations", data=values))
        await _refused(await cclient.post("/serverless/v1/streams/s", data=b"[" + values + b"]"))
    await _refused(await cclient.post("/serverless/v1/streams/s", data=msgpack.packb([list(range(LIMIT // 2))] * 3),
                                      headers=MSGPACK))
    with pytest.raises(BodyTooLargeError, match="maxBodyValues"):
        safe_json.loads(b'{"a": ' + STRINGS.replace(b'""', rb'"x\\,["') + b"}", max_values=LIMIT)


async def test_separators_inside_strings_do_not_count(cclient):
    assert IN_STRINGS.count(b",") + IN_STRINGS.count(b"[") + IN_STRINGS.count(b"{") > LIMIT
    resp = await cclient.post("/serverless/v1/functions/echo/invocations", data=IN_STRINGS)
    assert resp.status == 200 and await resp.json() == json.loads(IN_STRINGS)
    under = b"[" + b"1," * (LIMIT - 2) + b"1]"  # LIMIT - 2 commas and 1 bracket: LIMIT - 1 numbers, just under
    resp = await cclient.post("/v2/echo/run", data=b'{"input": ' + under + b"}")
    assert resp.status == 200, await resp.text()
    resp = await cclient.post("/serverless/v1/functions/echo/invocations", data=under)
    assert resp.status == 200 and len(await resp.json()) == LIMIT - 1
    many = [f"a,b[c{{{i}" for i in range(LIMIT // 4)]  # LIMIT // 4 strings of 3 separators each
    resp = await cclient.post("/serverless/v1/functions/echo/invocations", data=json.dumps(many).encode())
    assert resp.status == 200 and await resp.json() == many


def test_msgpack_counts_are_read_before_the_work():
    # The probe's 5 M `{}` in one array: refused on the array header, before any map is made.
    with pytest.raises(Exception, match="maxElementsPerPublish"):
        parse_elements(msgpack.packb([{}] * 20_000), MSGPACK["Content-Type"], 10_000, LIMIT)
    with pytest.raises(BodyTooLargeError, match="maxBodyValues"):
        parse_elements(msgpack.packb([[{}] * 100] * 11), MSGPACK["Content-Type"], 10_000, LIMIT)
    with pytest.raises(BodyTooLargeError, match="maxBodyValues"):
        parse_elements(msgpack.packb([list(range(LIMIT + 1))]), MSGPACK["Content-Type"], 10_000, LIMIT)
    ok = parse_elements(msgpack.packb([[{}] * 40] * 9), MSGPACK["Content-Type"], 10_000, LIMIT)  # 739 values
    assert ok[0] == b"[" + b",".join([b"{}"] * 40) + b"]"


def test_a_large_body_is_parsed_with_the_collector_paused():
    body = json.dumps([{"i": i} for i in range(20_000)]).encode()
    assert len(body) >= safe_json.LARGE_BODY
    passes: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])
    gc.callbacks.append(seen)
    try:
        value = safe_json.loads(body, max_values=1_000_000)
    finally:
        gc.callbacks.remove(seen)
    # none while it parsed (about 30 before); the one owed may run as the collector is turned back on
    assert len(value) == 20_000 and len(passes) <= 1 and gc.isenabled()


def test_a_publish_reads_no_further_than_its_element_limit():
    """A JSON array is parsed item by item and refused past `max_elements`: the rest (here a NaN,
    a 400 once parsed) is never read."""
    with pytest.raises(Exception, match="more than 5 elements") as err:
        parse_elements(b"[1, 2, 3, 4, 5, 6, NaN]", "application/json", 5, LIMIT)
    assert getattr(err.value, "status", None) == 413
    assert parse_elements(b' [1, "a", {"b": [2]}]\n', "application/json", 5, LIMIT) == [b"1", b"a", b'{"b":[2]}']
    assert parse_elements(b"[1, 2]\n[3]", "application/json", 5, LIMIT) == [b"[1,2]", b"[3]"]  # NDJSON
    assert safe_json.loads(b"[]", max_items=0) == [] and safe_json.loads(b"[ 1 ]", max_items=0) == [1]
    with pytest.raises(json.JSONDecodeError):
        safe_json.loads(b"[1, 2", max_items=5)


@pytest.mark.parametrize("text", [False, True])
def test_separators_are_counted_by_json_escape_rules(text):
    """Escapes are pairs read from the left: `\\\\` ends a string's escape, `\\"` stays inside it."""
    cases = {b'[1,2,{"a":"x,y"}]': 4, b'["a\\",b", 1]': 2, b'["a\\\\", 1, 2]': 3, b'["\\\\\\"", 3]': 2,
             b'{"a": "never closed,,,': 1, b'"\\': 0}
    for body, separators in cases.items():
        assert safe_json._separators_outside_strings(body.decode() if text else body, 100) == separators, body


async def test_a_string_that_never_closes_is_counted_in_one_pass(cclient):
    """The probe's body: escaped quotes in a string that never closes, then commas. The count used
    to retry from every escaped quote to the end of the body (quadratic: 10 s of a blocked loop for
    115 KB, hours near the body limit); it is one pass now, and the body a 400 for its JSON."""
    body = b'{"input":"' + b'\\",' * 40_000 + b"," * (LIMIT + 1)
    assert safe_json._separators_outside_strings(body, LIMIT) == 1  # the `{`: the rest is in the string
    resp = await cclient.post("/serverless/v1/functions/echo/invocations", data=body)
    assert resp.status == 400, await resp.text()
