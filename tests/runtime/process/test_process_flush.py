"""A process worker's writes made just before it dies by os._exit are flushed to the client."""
from __future__ import annotations

import json

import pytest

from frontend.client import iter_sse
from tests.support.servers import FUNCTIONS, PROCESS_FUNCTIONS


@pytest.mark.parametrize("run", range(3))
async def test_writes_before_os_exit_reach_the_client(make_client, run):
    client = await make_client(**{"runtime.codeRoots": [str(PROCESS_FUNCTIONS), str(FUNCTIONS)],
                                  "runtime.deployDir": None})
    manifest = {"name": "p-last", "handler": "proc.last_words", "codePath": ".", "executor": "process",
                "instances": 1}
    assert (await client.post("/admin/v1/functions", data=json.dumps(manifest))).status == 201
    resp = await client.post("/serverless/v1/functions/p-last/invocations", json={"n": 3},
                             headers={"Accept": "text/event-stream"})
    events = [e["data"] async for e in iter_sse(resp)]
    assert events[:3] == ["word 0", "word 1", "word 2"], events
    assert "exited with code 9" in events[3] and events[-1] == "[DONE]"
