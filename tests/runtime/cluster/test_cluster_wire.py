"""The cluster's wire (runtime/cluster/wire.py): every message typed, read in one place, with its
protocol version. A message of another version is refused with a log line naming both versions,
never misread; a malformed one is refused without stopping the reader that met it."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import pytest

from runtime.cluster import wire
from runtime.cluster.queue import WorkQueue
from runtime.cluster.settings import Keys, connect
from runtime.cluster.wire import PROTOCOL, ProtocolMismatch, WireError
from runtime.manifest import FunctionSpec
from tests.support.cluster import RELAY, deploy, frontend_args, serving, sse, status, wait_until

KEYS = Keys()
OTHER = PROTOCOL + 1


def _entry(inv_id: str, **fields: str) -> dict[str, str]:
    """A queue entry of `relay` as a frontend writes it, with `fields` changed."""
    args = wire.encode_call(inv_id, "relay", "{}", mode="json", trace="t" * 32, deadline=time.time() + 30,
                            buffer=10, max_write=1000, max_response=1000, buffer_bytes=None, items=False,
                            reply=None)
    return {**dict(zip(args[::2], map(str, args[1::2]), strict=True)), **fields}


async def _call(s: aiohttp.ClientSession, base: str, event: dict) -> dict:
    async with s.post(f"{base}/serverless/v1/functions/relay/invocations", json=event) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def _logged(process, *texts: str):
    async def probe():
        out = process.output()
        return out if all(t in out for t in texts) else None
    return probe


def _queue_drained(r) -> bool:
    queue = KEYS.queue("relay")
    return r.xlen(queue) == 0 and r.xpending(queue, Keys.GROUP)["pending"] == 0


# -- pure: what is encoded is what is decoded ----------------------------------------------------
def test_a_call_reads_back_as_it_was_written():
    call = wire.decode_call("1-0", _entry("inv-1", bufferBytes="500", items="1", reply="fnstream:{answers:n}"))
    assert (call.id, call.function, call.event, call.mode, call.buffer, call.buffer_bytes, call.items,
            call.reply) == ("inv-1", "relay", {}, "json", 10, 500, True, "fnstream:{answers:n}")
    legacy = {k: v for k, v in _entry("inv-2").items() if k != "p"}   # a node from before versions
    assert wire.decode_call("2-0", legacy).id == "inv-2"
    with pytest.raises(ProtocolMismatch, match=f"protocol {OTHER}; this node speaks protocol {PROTOCOL}"):
        wire.decode_call("3-0", _entry("inv-3", p=str(OTHER)))
    for bad in ({"deadline": "soon"}, {"event": "{not json"}, {"buffer": "lots"}, {"p": "two"}):
        with pytest.raises(WireError):
            wire.decode_call("4-0", _entry("inv-4", **bad))


def test_output_heartbeats_records_and_cancels_check_their_version():
    data = wire.decode_output(wire.data_entry(wire.origin("w1"), 3, [2, 1], ["ab", "c"], None))
    assert isinstance(data, wire.Data) and (data.worker, data.index, data.lengths, data.payloads) == (
        "w1", 3, [2, 1], "abc")
    with pytest.raises(ProtocolMismatch):
        wire.decode_output({**wire.result_entry("1"), "w": "w2", "p": str(OTHER)})
    with pytest.raises(WireError, match="do not match"):
        wire.decode_output({"t": "data", "n": "5", "d": "ab"})
    info = json.loads(wire.encode_heartbeat(0, 0, ["relay"]))
    assert wire.decode_heartbeat("w1", json.dumps(info))["functions"] == ["relay"]
    with pytest.raises(ProtocolMismatch):
        wire.decode_heartbeat("w1", json.dumps({**info, "protocol": OTHER}))
    record = wire.encode_record({"name": "f"}, 7, "node-a", None)
    assert wire.decode_record("f", record).version == 7
    with pytest.raises(ProtocolMismatch):
        wire.decode_record("f", json.dumps({**json.loads(record), "protocol": OTHER}))
    assert wire.decode_cancel(b"abc_-DEF") == "abc_-DEF"
    with pytest.raises(ProtocolMismatch):
        wire.decode_cancel(json.dumps({"protocol": OTHER, "id": "x"}))
    for bad in ("", "two words", "{not json"):
        with pytest.raises(WireError):
            wire.decode_cancel(bad)


# -- a worker node meets them ---------------------------------------------------------------------
async def test_a_queue_entry_of_another_protocol_is_refused_and_logged(redis_server, start_server, start_worker):
    r = redis_server.client()
    async with serving(redis_server.url, start_server, start_worker) as sv:
        reply = KEYS.answers("frontend-of-another-version")
        r.xadd(KEYS.queue("relay"), _entry("from-another-version", p=str(OTHER), reply=reply))
        log = await wait_until(_logged(sv.worker, "refusing entry", "from-another-version"), "the refusal logged")
        assert f"cluster protocol {OTHER}; this node speaks protocol {PROTOCOL}" in log
        [(_id, answer)] = await wait_until(lambda: r.xrange(reply), "the refusal answered")   # not run
        assert answer["id"] == "from-another-version" and answer["t"] == "error" and answer["p"] == str(PROTOCOL)
        assert f"protocol {OTHER}" in answer["message"]
        await wait_until(lambda: _queue_drained(r), "the refused entry acked and dropped")
        r.publish(KEYS.cancel_channel, json.dumps({"protocol": OTHER, "id": "from-another-version"}))
        await wait_until(_logged(sv.worker, "refusing a message on fnstream:cancel", f"protocol {OTHER}"),
                         "the cancel of another version refused")
        assert (await _call(sv.session, sv.frontend.url, {"count": 0}))["count"] == 0   # the worker reads on


async def test_a_malformed_queue_entry_is_refused_without_killing_the_reader(redis_server, start_server,
                                                                            start_worker):
    """Before the wire module a deadline that is no number raised in the intake: the entry stayed
    pending (and the reclaim loop, which met it again, ended)."""
    r = redis_server.client()
    async with serving(redis_server.url, start_server, start_worker) as sv:
        for inv_id, bad in (("bad-deadline", {"deadline": "soon"}), ("bad-event", {"event": "{not json"}),
                            ("bad-buffer", {"buffer": "lots"})):
            r.xadd(KEYS.queue("relay"), _entry(inv_id, **bad))
        log = await wait_until(_logged(sv.worker, "bad-deadline", "bad-event", "bad-buffer"), "three refusals")
        assert "its deadline is not a number" in log and "its event is not JSON" in log
        await wait_until(lambda: _queue_drained(r), "the malformed entries acked and dropped")
        errors = await wait_until(lambda: [f for _id, f in r.xrange(KEYS.output("bad-event"))],
                                  "the refusal answered on its own stream")
        assert errors and errors[0]["t"] == "error" and "not JSON" in errors[0]["message"]
        assert (await _call(sv.session, sv.frontend.url, {"count": 0}))["count"] == 0
        code, events = await sse(sv.session, sv.frontend.url, "relay", {"count": 3})
        assert code == 200 and len(events) >= 3


# -- a frontend meets them ------------------------------------------------------------------------
async def test_a_heartbeat_of_another_protocol_is_no_live_worker(redis_server, start_server):
    front = start_server(*frontend_args(redis_server.url))
    r = redis_server.client()
    async with aiohttp.ClientSession() as s:
        await deploy(s, front.url, RELAY)
        r.set(KEYS.worker("worker-of-another-version"),
              json.dumps({"running": 0, "completed": 0, "functions": ["relay"], "answers": 1, "protocol": OTHER}),
              px=60_000)
        r.set(KEYS.worker("worker-garbled"), "{not json", px=60_000)
        log = await wait_until(_logged(front, "not counting worker worker-of-another-version",
                                       "not counting worker worker-garbled"), "the heartbeats refused")
        assert f"cluster protocol {OTHER}; this node speaks protocol {PROTOCOL}" in log
        assert (await status(s, front.url))["workers"] == []
        async with s.post(f"{front.url}/serverless/v1/functions/relay/invocations", json={}) as resp:
            assert resp.status == 503 and "no live worker serves" in await resp.text()
        assert front.output().count("not counting worker worker-garbled") == 1   # said once, not every scan


async def test_registry_records_of_another_protocol_or_malformed_are_left_alone(redis_server, start_server):
    """Before, a record without a version ended the node's registry sync: later deploys never came."""
    a = start_server(*frontend_args(redis_server.url, role="all"))
    b = start_server(*frontend_args(redis_server.url, role="all"))
    r = redis_server.client()
    alien = json.dumps({"spec": {**RELAY, "name": "alien"}, "version": 10**6, "node": "n2", "protocol": OTHER})
    r.hset(KEYS.functions, mapping={"alien": alien, "broken": json.dumps({"spec": {}})})
    r.publish(KEYS.registry_channel, "0")
    await wait_until(_logged(a, "registry record 'alien'", f"protocol {OTHER}", "registry record 'broken'"),
                     "the records refused")
    async with aiohttp.ClientSession() as s:
        await deploy(s, a.url, RELAY)

        async def on_b():
            async with s.get(f"{b.url}/admin/v1/functions") as resp:
                names = [f["name"] for f in (await resp.json())["functions"]]
            return "relay" in names and names
        names = await wait_until(on_b, "the deploy on A applied on B")
        assert "alien" not in names
    assert json.loads(r.hget(KEYS.functions, "alien"))["protocol"] == OTHER   # not overwritten


@pytest.fixture
async def work_queue(redis_server):
    queue = WorkQueue(connect(redis_server.url), KEYS, "frontend-test", ttl=60, heartbeat=1)
    yield queue
    await queue.close()
    await queue.redis.aclose()


async def _submit(queue: WorkQueue, mode: str):
    spec = FunctionSpec(name="nobody-runs-it", handler="x.handler", timeout=30)
    return await queue.submit(spec, {}, mode=mode, buffer_events=10, max_write_size=1000, max_response_size=1000,
                              trace_id=None, reply=True)


async def test_output_and_answers_of_another_protocol_fail_their_call(work_queue, caplog):
    caplog.set_level(logging.WARNING, "fnstream.cluster")
    answered = await _submit(work_queue, "json")
    await work_queue.redis.xadd(work_queue.answers.key, {"id": answered.id, **wire.result_entry("1"),
                                                         "w": "worker-v2", "p": str(OTHER)})
    with pytest.raises(ProtocolMismatch, match=f"protocol {OTHER}; this node speaks protocol {PROTOCOL}"):
        await asyncio.wait_for(answered.encoded_result(), 10)
    streamed = await _submit(work_queue, "sse")
    await work_queue.redis.xadd(KEYS.output(streamed.id), {"t": "data", "w": "worker-v2", "p": str(OTHER),
                                                           "i": "0", "n": "1", "d": "x"})
    with pytest.raises(ProtocolMismatch):
        await asyncio.wait_for(streamed.encoded_result(), 10)
    assert streamed.events == 0   # nothing of it relayed
    garbled = await _submit(work_queue, "sse")
    await work_queue.redis.xadd(KEYS.output(garbled.id), {"t": "data", "w": "worker-x", "i": "0", "n": "5", "d": "ab"})
    with pytest.raises(WireError, match="do not match"):
        await asyncio.wait_for(garbled.encoded_result(), 10)
    refusals = [r.getMessage() for r in caplog.records if "refusing the" in r.getMessage()]
    assert len(refusals) == 3 and f"protocol {OTHER}" in refusals[0]
