"""An invocation by its id (`X-Invocation-Id`): read its output again, or cancel it.

`GET /serverless/v1/invocations/{id}/events` answers what the invoke route's SSE answer said (the
same events with the same `id:`s, then the result or error event and `data: [DONE]`), from after
`Last-Event-ID` (or `?from=`), live while it runs. When the kept window (runtime/durable.py) no
longer reaches back that far it says so in an `event: error` and ends. `POST .../cancel` stops
it. Only its tenant (or an admin) sees it: anyone else gets the 404 an unknown id gets.
"""
from __future__ import annotations

import json

from aiohttp import web

from runtime.durable import DONE, InvocationNotFoundError
from runtime.errors import BadRequestError
from runtime.streams import SubscriptionCutError, SubscriptionEndedError

from ..auth import principal_of
from ..jobs import JOBS
from ..keys import CONFIG, OUTPUTS
from ..openapi import SSE, Op, Param, document
from ..sse import DONE_EVENT, EventStream, encode_event
from ..tenancy import stream_tenant
from .jobs import job_events

__all__ = ("routes", "LOST_CODE")

routes = web.RouteTableDef()
LOST_CODE = 200416  # `event: error`: the events asked for are no longer kept
_MAX_ID = 10**15
_DONE = DONE.encode()


def _from_id(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        raw = request.query.get("from", "0")
    raw = raw.strip() or "0"
    if len(raw) > 16 or not raw.isdigit() or int(raw) > _MAX_ID:
        raise BadRequestError(f"Last-Event-ID / ?from= must be an event id (an integer >= 0), got {raw[:40]!r}")
    return int(raw)


@routes.get("/serverless/v1/invocations/{inv_id}/events")
async def events(request: web.Request) -> web.StreamResponse:
    outputs = request.app[OUTPUTS]
    inv_id = request.match_info["inv_id"]
    try:
        rec = outputs.find(principal_of(request), inv_id)
    except InvocationNotFoundError:
        manager = request.app.get(JOBS)
        job = await manager.by_invocation(inv_id, principal_of(request)) if manager is not None else None
        if job is not None:  # a job's run (this node's): the job's own events, which are kept with it
            return await job_events(request, job)
        if not outputs.shared:
            raise
        rec = await outputs.find_shared(stream_tenant(request), inv_id)  # another frontend's (cluster mode)
    from_id = _from_id(request)
    had = from_id  # the events the client has: never sent again
    if from_id >= rec.next_id:
        if not rec.remote:  # nothing that far yet: the 400 the stream itself would give, said plainly
            raise BadRequestError(f"invocation {inv_id!r} has had {rec.next_id - 1} events; "
                                  f"Last-Event-ID {from_id} is beyond them")
        # Another frontend's answer: it publishes off the answer's path, so its client may hold
        # ids not yet in the shared stream. Read on from its last element (an ended one's `[DONE]`
        # ends this answer at once), past what the client has.
        from_id = max(rec.next_id - 2, 0)
    heartbeat = request.app[CONFIG].frontend.args.heartbeatSeconds
    out = EventStream(request, headers={"X-Invocation-Id": inv_id})
    if rec.done_id is not None and from_id >= rec.done_id:  # (the end has no id of its own: only a guess asks)
        await out.write(DONE_EVENT)
        return await out.finish()
    while True:  # once more after a cut (a reader too slow for the live events): from where it was
        if rec.broken is not None:
            await out.write(_error(f"the output of invocation {inv_id} is not kept whole: {rec.broken}"))
            return await out.finish()
        await outputs.flushed(rec)  # (cluster mode: what this frontend answered but had not yet published)
        sub = await outputs.subscribe(rec, from_id)
        try:
            if sub.lost is not None:
                first, last = sub.lost
                await out.write(_error(f"events {first}..{last} of invocation {inv_id} are no longer kept "
                                       "(streams.invocationRetentionBytes); resume after a later id to read the rest",
                                       lost_from_id=first, lost_to_id=last))
                return await out.finish()
            while True:
                try:
                    batch = await sub.next_batch(timeout=heartbeat)
                except SubscriptionCutError:
                    from_id = sub.last_id
                    break
                except SubscriptionEndedError as exc:  # its retention ran out while being read
                    await out.write(_error(f"the output of invocation {inv_id} is no longer kept: {exc.message}"))
                    return await out.finish()
                if not batch:
                    await out.ping()
                    continue
                chunks = []
                for el in batch:
                    if el.id == rec.done_id or (rec.remote and el.data == _DONE):
                        chunks.append(DONE_EVENT)
                        await out.write(b"".join(chunks))
                        return await out.finish()
                    if el.id <= had:
                        continue
                    chunks.append(encode_event(el.data.decode("utf-8", "surrogatepass"),
                                               el.id if rec.plain is None else None))  # (OpenAI's: no ids)
                await out.write(b"".join(chunks))
        finally:
            await sub.close()


def _error(message: str, **extra: int) -> bytes:
    body = {"code": LOST_CODE, "message": message, **extra}
    return encode_event(json.dumps(body, ensure_ascii=False, separators=(",", ":")), event="error")


@routes.post("/serverless/v1/invocations/{inv_id}/cancel")
async def cancel(request: web.Request) -> web.Response:
    inv_id = request.match_info["inv_id"]
    outputs = request.app[OUTPUTS]
    try:
        outputs.cancel(principal_of(request), inv_id)
    except InvocationNotFoundError:
        if not outputs.shared:
            raise
        await outputs.cancel_shared(stream_tenant(request), inv_id)  # answered by another frontend
    return web.json_response({"id": inv_id, "status": "cancelled"})


_ID_DOC = ("Kept for SSE invocations: while they run and for streams.invocationRetentionSeconds after; the same "
           "output is the named stream `invocations/{id}` of the tenant.")
document(
    Op("GET", "/serverless/v1/invocations/{inv_id}/events", "invocations",
       "An SSE invocation's output again, by its X-Invocation-Id",
       description="The same events with the same ids as the invoke answer, then the result (or error) event and "
                   "`data: [DONE]`; live while it runs. `event: error` when the kept window no longer reaches back. "
                   + _ID_DOC,
       ok=SSE, params=(Param("Last-Event-ID", "header", "resume after this event id"),
                       Param("from", "query", "as Last-Event-ID (EventSource cannot set headers)")),
       errors=(400, 404), role="user"),
    Op("POST", "/serverless/v1/invocations/{inv_id}/cancel", "invocations", "Cancel a running SSE invocation",
       description="Its answer (and kept output) ends with the cancel error, then `data: [DONE]`. " + _ID_DOC,
       errors=(404, 409), role="user"),
)
