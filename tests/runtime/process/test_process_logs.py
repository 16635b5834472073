"""Logs made in `executor: process` workers reach the server's log in its format: with
`logging.format: json`, one JSON object per line carrying the trace id, function and invocation
id of the invocation that logged (handler logs and the worker's own)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.support.servers import PROCESS_FUNCTIONS, ServerProcess

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _invoke(server: ServerProcess, name: str, span: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{server.url}/serverless/v1/functions/{name}/invocations", data=b"{}",
                                 headers={"traceparent": f"00-{TRACE}-{span}-01", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_process_worker_logs_are_json_lines_with_the_invocation(deploy_dir):
    code = str(PROCESS_FUNCTIONS)
    deploy = deploy_dir(*({"name": name, "handler": f"proc.{handler}", "codePath": code, "executor": "process"}
                          for name, handler in (("plogs", "logs"), ("palogs", "alogs"), ("pfails", "logs_and_fails"))))
    server = ServerProcess("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots={json.dumps([code])}",
                           "-s", "logging.format=json")
    try:
        status, body = _invoke(server, "plogs", "00f067aa0ba902b7")
        assert status == 200
        worker_pid = body["pid"]
        assert _invoke(server, "palogs", "00f067aa0ba902b8")[0] == 200
        assert _invoke(server, "pfails", "00f067aa0ba902b9")[0] == 500
    finally:
        output = server.stop()
    lines = [line for line in output.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    # Nothing a worker logged came out as a text line (a traceback's lines are inside its JSON object).
    others = [line for line in lines if not line.startswith("{")]
    assert not [line for line in others if "worker" in line or "Traceback" in line or "hello" in line], others

    def record(message: str) -> dict:
        found = [r for r in records if message in r["message"]]
        assert len(found) == 1, (message, records)
        return found[0]

    hello = record("process handler says hello")
    assert hello["logger"] == "fnstream.function.plogs" and hello["level"] == "INFO"
    plain = record("a plain logger in worker")
    caught = record("caught it")
    assert "ZeroDivisionError" in caught["message"] + caught.get("exception", "")
    for r in (hello, plain, caught):
        assert r["trace_id"] == TRACE and r["function"] == "plogs" and r["worker"] == worker_pid
        assert len(r["invocation_id"]) == 22  # 128 random bits (X-Invocation-Id)
    assert hello["invocation_id"] == plain["invocation_id"] == caught["invocation_id"]
    assert plain["level"] == "WARNING" and plain["logger"] == "user.code"

    async_hello = record("async handler says hello")
    assert async_hello["function"] == "palogs" and async_hello["trace_id"] == TRACE
    assert async_hello["invocation_id"] != hello["invocation_id"]

    raised = record("the process handler failed")  # the worker's own log line with the traceback
    assert raised["level"] == "ERROR" and raised["function"] == "pfails" and raised["trace_id"] == TRACE
    assert "Traceback" in raised["message"] and len(raised["invocation_id"]) == 22
    # The worker's own lines outside an invocation name their function too.
    started = [r for r in records if r.get("worker") and not r.get("invocation_id")]
    assert all(r["function"] in ("plogs", "palogs", "pfails") for r in started), started


def test_process_worker_logs_in_text_format_name_the_worker(deploy_dir):
    code = str(PROCESS_FUNCTIONS)
    deploy = deploy_dir({"name": "plogs", "handler": "proc.logs", "codePath": code, "executor": "process"})
    server = ServerProcess("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots={json.dumps([code])}")
    try:
        status, body = _invoke(server, "plogs", "00f067aa0ba902b7")
        assert status == 200
    finally:
        output = server.stop()
    said = [line for line in output.splitlines() if "process handler says hello" in line]
    assert len(said) == 1 and said[0].endswith(f"INFO fnstream.function.plogs: [worker {body['pid']}] "
                                               "process handler says hello"), output


def test_a_worker_cannot_log_as_another_function_or_invocation(deploy_dir):
    """The worker runs the user's code: the frontend, not the worker, says whose a record is. A
    record may name only an invocation this worker runs (its trace id then the frontend's own), and
    always this worker's function."""
    code = str(PROCESS_FUNCTIONS)
    deploy = deploy_dir({"name": "pliar", "handler": "proc.logs_as_another", "codePath": code,
                         "executor": "process"})
    server = ServerProcess("--deploy-dir", str(deploy), "-s", f"runtime.codeRoots={json.dumps([code])}",
                           "-s", "logging.format=json")
    try:
        status, _body = _invoke(server, "pliar", "00f067aa0ba902b7")
        assert status == 200
    finally:
        output = server.stop()
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    said = [r for r in records if "who am I" in r["message"]]
    assert len(said) == 1, records
    assert said[0]["function"] == "pliar"                        # not "someone-else"
    assert not said[0].get("invocation_id") and not said[0].get("trace_id")   # not the ids it claimed
