"""Session routes: interrupt or end an X-Instance-Session of a function (openYuanrong's API).

`POST /serverless/v1/functions/{ref}/sessions/{sessionId}/interrupt` stops the session's running
invocations (a streaming client gets the error event, then `[DONE]`); `DELETE
/serverless/v1/functions/{ref}/sessions/{sessionId}` ends the session. Unknown session: 404.
"""
from __future__ import annotations

from aiohttp import web

from runtime.deployment import Deployment
from runtime.errors import FunctionNotFoundError
from runtime.sessions import SessionTable

from ..auth import principal_of
from ..keys import DISPATCHER

__all__ = ("routes",)

routes = web.RouteTableDef()


def _table(request: web.Request) -> tuple[SessionTable, str]:
    """The session table of the function the path names (404/403 as invoking it), and the session id."""
    ref, session_id = request.match_info["ref"], request.match_info["session_id"]
    function = request.app[DISPATCHER].find(principal_of(request), ref)
    if not isinstance(function, Deployment):  # known to the cluster, not deployed here: its sessions live elsewhere
        raise FunctionNotFoundError(f"session {session_id!r} not found on this node", code=200404)
    return function.sessions, session_id


@routes.post("/serverless/v1/functions/{ref}/sessions/{session_id}/interrupt")
async def interrupt_session(request: web.Request) -> web.Response:
    table, session_id = _table(request)
    session = table.get(session_id)
    count = session.interrupt(f"session {session_id!r} was interrupted")
    return web.json_response({"code": 0, "message": "SUCCESS", "sessionID": session_id, "interrupted": count})


@routes.delete("/serverless/v1/functions/{ref}/sessions/{session_id}")
async def end_session(request: web.Request) -> web.Response:
    table, session_id = _table(request)
    session = table.end(session_id)
    return web.json_response({"code": 0, "message": "SUCCESS", "sessionID": session_id,
                              "running": len(session.running)})
