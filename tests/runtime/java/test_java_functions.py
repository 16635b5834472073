"""Java functions end to end over real sockets: one `fnstream serve` with worker JVMs, shared by the
module (a JVM start is the expensive part). The seed's Java handler is deployed from its text,
unchanged (functions/java_demo); the others are tests/java_functions/javatest/Fns.java."""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.servers import DEPLOY, FUNCTIONS, HELLO_BYTES, TESTS, ServerProcess

pytestmark = pytest.mark.skipif(shutil.which("javac") is None or not Path("/usr/share/java/gson.jar").is_file(),
                                reason="needs a JDK (javac) and gson (libgoogle-gson-java)")

JAVA_FNS = TESTS / "java_functions"
SSE = {"Accept": "text/event-stream"}
INVOKE = "/serverless/v1/functions/{}/invocations"
# The Python hello's SSE answer with the Java event as gson writes it (no space after the colon).
JAVA_HELLO_BYTES = HELLO_BYTES.replace(b'{"event": "this is a stream"}', b'{"event":"this is a stream"}')


def _fn(name: str, method: str, **fields) -> dict:
    return {"name": name, "runtime": "java17", "handler": f"javatest.Fns::{method}", "codePath": str(JAVA_FNS),
            "timeout": 30, **fields}


FUNCTIONS_UNDER_TEST = [
    _fn("jfields", "fields", initializer="javatest.Fns::init", environment={"GREETING": "hi"}, instances=1,
        memory=128),
    _fn("jupper", "upper"),
    _fn("jzero", "upper", minInstances=0, scaleDownIdleSeconds=0.3),
    _fn("jbadinit", "upper", initializer="badInit"),
    _fn("jpoint", "point"),
    _fn("jstep", "stepped"),
    _fn("jmany", "many"),
    _fn("jflood", "flood"),
    _fn("jboom", "boom"),
    _fn("jsleep", "sleep", timeout=1, instances=1),
    _fn("jstub", "stubborn", timeout=1, instances=1),
    _fn("jexit", "exit", instances=1),
    _fn("jover", "overflow", instances=1),
    _fn("joom", "oom", memory=48, instances=1),
    _fn("jpair", "pair", instances=1, instanceConcurrency=2),
    _fn("jstdio", "stdio", instances=1, instanceConcurrency=2),
    _fn("jover1", "over", instances=1),
    _fn("jlate", "late", instances=1),
    _fn("jover2", "revo", instances=1),
]


class JavaServer(ServerProcess):
    """A server whose start compiles the SDK and the test code on a cold cache and starts a dozen JVMs."""

    def _wait_ready(self, timeout: float = 90) -> None:
        super()._wait_ready(timeout)


@pytest.fixture(scope="module")
def jserver(tmp_path_factory):
    deploy = tmp_path_factory.mktemp("java-deploy")
    demo = yaml.safe_load((DEPLOY / "java-demo.yaml").read_text())
    demo["codePath"] = str(FUNCTIONS / "java_demo")
    (deploy / "java-demo.yaml").write_text(yaml.safe_dump(demo))
    (deploy / "tests.yaml").write_text(yaml.safe_dump(FUNCTIONS_UNDER_TEST))
    code = tmp_path_factory.mktemp("java-code")
    server = JavaServer("--deploy-dir", str(deploy), "-s",
                           f"runtime.codeRoots={json.dumps([str(FUNCTIONS), str(JAVA_FNS), str(code)])}")
    server.code = code
    yield server
    server.stop()


async def _post(server, name: str, body, headers=None) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.post(server.url + INVOKE.format(name), data=json.dumps(body),
                                                    headers=headers or {}) as r:
        return r.status, await r.json()


async def test_the_seed_handler_answers_json_as_the_python_hello(jserver):
    async with aiohttp.ClientSession() as s:
        async with s.post(jserver.url + INVOKE.format("java-demo"), data="{}") as r:
            java = (r.status, await r.read())
        async with s.post(jserver.url + INVOKE.format("java-demo"), data="{}", headers=SSE) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            java_sse = await r.read()
    assert java == (200, b'"ok"')
    assert java_sse == JAVA_HELLO_BYTES


async def test_events_arrive_while_the_handler_runs(jserver, tmp_path):
    """The handler waits for a signal the test gives only once the first event arrived: the later
    events exist only if the first reached the client while the handler was still running."""
    signal = tmp_path / "go"
    async with aiohttp.ClientSession() as s, \
            s.post(jserver.url + INVOKE.format("jstep"), json={"signal": str(signal)}, headers=SSE) as r:
        lines = r.content.__aiter__()
        first = await asyncio.wait_for(lines.__anext__(), 20)
        assert first == b"id: 1\n"
        assert await lines.__anext__() == b"data: one\n"
        assert not signal.exists()
        signal.write_text("go")
        rest = b"".join([line async for line in lines])
    assert rest == (b'\nid: 2\ndata: {"n":2}\n\nid: 3\ndata: [3,4]\n\nid: 4\ndata: "done"\n\ndata: [DONE]\n\n')


async def test_many_events_return_their_credits(jserver):
    """More writes than the worker's credits (256): each comes back once the frontend took the write."""
    async with aiohttp.ClientSession() as s, \
            s.post(jserver.url + INVOKE.format("jmany"), json={"n": 3000}, headers=SSE) as r:
        data = [line for line in (await r.read()).split(b"\n") if line.startswith(b"data: ")]
    assert data[:2] == [b'data: {"i":0}', b'data: {"i":1}'] and data[2999] == b'data: {"i":2999}'
    assert data[3000:] == [b'data: "ok"', b"data: [DONE]"]


async def test_a_slow_client_holds_the_writer_back(jserver, tmp_path):
    """A client that stops reading stops the handler's writes (credits, then the bounded channel):
    the handler cannot run ahead; once the client reads on, every event arrives."""
    progress, n = tmp_path / "progress", 2000
    async with aiohttp.ClientSession() as s, \
            s.post(jserver.url + INVOKE.format("jflood"), json={"n": n, "size": 10_000, "progress": str(progress)},
                   headers=SSE) as r:
        assert await r.content.readline() == b"id: 1\n"
        seen, still = -1, 0
        while still < 10:  # until the handler's progress stops moving
            await asyncio.sleep(0.1)
            now = int(progress.read_text()) if progress.exists() else 0
            still = still + 1 if now == seen else 0
            seen = now
        assert 0 < seen < n, seen  # held back: 20 MB were not buffered anywhere
        body = await r.read()
    assert body.count(b"data: {") == n and body.endswith(f'data: {n}\n\ndata: [DONE]\n\n'.encode())


async def test_a_client_that_leaves_interrupts_the_handler(jserver, tmp_path):
    signal = tmp_path / "never"
    async with aiohttp.ClientSession() as s:
        r = await s.post(jserver.url + INVOKE.format("jstep"), json={"signal": str(signal)}, headers=SSE)
        assert await r.content.readline() == b"id: 1\n"
        r.close()
    marker = Path(str(signal) + ".cancelled")
    for _ in range(400):
        if marker.exists() and marker.read_text():
            break
        await asyncio.sleep(0.05)
    assert marker.read_text() == "interrupted"


async def test_context_fields_initializer_once_and_logger(jserver):
    async with aiohttp.ClientSession() as s:
        bodies = []
        for _ in range(3):
            async with s.post(jserver.url + INVOKE.format("jfields"), json={"a": [1, 2]},
                              headers={"X-Trace-Id": "trace-java-1"}) as r:
                assert r.status == 200
                bodies.append(await r.json())
    body = bodies[0]
    assert body["event"] == {"a": [1, 2]}
    assert body["requestId"] == "trace-java-1" and body["invokeId"] and body["invokeId"] != body["requestId"]
    assert (body["functionName"], body["tenant"], body["projectId"], body["version"]) == \
        ("jfields", "default", "default", "latest")
    assert (body["memory"], body["greeting"], body["timeout"]) == (128, "hi", 30)
    assert "missing" in body and body["missing"] is None
    assert 0 < body["remaining"] <= 30_000
    assert [b["inits"] for b in bodies] == [1, 1, 1]  # the initializer ran once in this instance
    assert len({b["pid"] for b in bodies}) == 1
    assert "initialised jfields" in jserver.output() and f"fields of {body['invokeId']}" in jserver.output()


async def test_scale_to_zero_and_a_cold_start(jserver):
    assert await _post(jserver, "jzero", "a") == (200, "A")
    for _ in range(400):
        pool = await _pool(jserver, "jzero")
        if pool["instances"] == 0:
            break
        await asyncio.sleep(0.05)
    assert pool["instances"] == 0, pool
    assert await _post(jserver, "jzero", "b") == (200, "B")  # a new JVM, started for this call
    after = await _pool(jserver, "jzero")
    assert after["coldStarts"] == pool["coldStarts"] + 1 and after["restarts"] == 0


async def test_a_failed_initializer_answers_4201(jserver):
    status, body = await _post(jserver, "jbadinit", "x")
    assert status == 500 and body["code"] == 4201, body
    assert "initializer failed: java.lang.IllegalStateException: no database" in body["message"]


async def test_pre_stop_runs_when_the_function_is_deleted(jserver):
    done = jserver.code / "bye.txt"
    status, body = await _deploy(jserver, _fn("jbye", "upper", preStop="javatest.Fns::bye", instances=1,
                                              environment={"BYE_FILE": str(done)}))
    assert status == 201, body
    assert await _post(jserver, "jbye", "x") == (200, "X")
    async with aiohttp.ClientSession() as s, s.delete(f"{jserver.url}/admin/v1/functions/jbye") as r:
        assert r.status == 200
    for _ in range(400):
        if done.exists():
            break
        await asyncio.sleep(0.05)
    assert done.read_text() == "bye from jbye"


async def test_a_session_turn_sees_its_session_id(jserver):
    session = {"X-Instance-Session": json.dumps({"sessionID": "java-chat-1", "sessionTTL": 60})}
    status, body = await _post(jserver, "jfields", {}, headers=session)
    assert status == 200 and body["session"] == "java-chat-1"
    status, plain = await _post(jserver, "jfields", {})
    assert plain["session"] == ""


async def test_string_event_and_pojo_result(jserver):
    assert await _post(jserver, "jupper", "shout") == (200, "SHOUT")
    assert await _post(jserver, "jupper", {"k": "v"}) == (200, '{"K":"V"}')  # a String parameter gets the JSON text
    assert await _post(jserver, "jpoint", {}) == (200, {"x": 1, "label": "p", "more": [2, 3]})
    big = "é€𝄞" * 30_000  # 270 KB of UTF-8 (an event the frontend sends from a thread), astral chars too
    assert await _post(jserver, "jupper", big) == (200, big.upper())
    assert "upper called with 120000 chars" in jserver.output()  # System.out goes to the log


async def test_an_exception_is_the_routes_json_error(jserver):
    status, body = await _post(jserver, "jboom", {})
    # openYuanrong's Java runtime's code and message (FaaSHandler: FUNCTION_RUN_ERROR, cause.toString())
    assert status == 500 and body["code"] == 4002
    assert body["message"] == "java.lang.IllegalStateException: no widgets"
    assert "at javatest.Fns.boom" in jserver.output()  # the stack trace is in the log
    status, body = await _post(jserver, "jpoint", "not an object")
    assert status == 200  # an Object parameter takes any JSON
    status, body = await _post(jserver, "jstep", "not an object")
    assert status == 500 and "the event cannot be converted to the handler's JsonObject parameter" in body["message"]


async def test_timeout_interrupts_the_thread_and_keeps_the_jvm(jserver):
    status, body = await _post(jserver, "jsleep", {"seconds": 0.01})
    assert (status, body) == (200, "slept")
    before = await _pool(jserver, "jsleep")
    status, body = await _post(jserver, "jsleep", {"seconds": 20})
    assert status == 504 and body["code"] == 4010 and "timed out" in body["message"]
    assert await _post(jserver, "jsleep", {"seconds": 0.01}) == (200, "slept")
    after = await _pool(jserver, "jsleep")
    assert [w["pid"] for w in after["workers"]] == [w["pid"] for w in before["workers"]]  # interrupted, not killed


async def test_a_handler_that_ignores_the_interrupt_loses_its_jvm(jserver):
    before = [w["pid"] for w in (await _pool(jserver, "jstub"))["workers"]]
    status, body = await _post(jserver, "jstub", {"seconds": 20})
    assert status == 504 and "timed out" in body["message"]
    for _ in range(400):  # the handler holds its slot for the grace period, then its JVM is killed
        workers = (await _pool(jserver, "jstub"))["workers"]
        if workers and [w["pid"] for w in workers] != before and workers[0]["state"] == "idle":
            break
        await asyncio.sleep(0.05)
    status, pid = await _post(jserver, "jstub", {"seconds": 0})
    assert status == 200 and [pid] != before  # answered by the JVM that replaced the killed one
    assert "did not stop within" in jserver.output()


async def _pool(server, name: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{server.url}/admin/v1/functions/{name}") as r:
        return (await r.json())["function"]["status"]["pool"]


@pytest.mark.parametrize(("name", "words"), [("jexit", "exited with code 3"),
                                              ("jover", "java.lang.StackOverflowError"),
                                              ("joom", "exceeded its memory limit of 48 MB")])
async def test_a_crash_is_a_500_and_a_fresh_jvm_answers_next(jserver, name, words):
    status, body = await _post(jserver, name, {})
    assert status == 500 and words in body["message"], body
    deadline = time.monotonic() + 30
    while True:  # the replacement JVM answers the same way: the function keeps serving
        status, again = await _post(jserver, name, {})
        if status == 500 and words in again["message"]:
            break
        assert time.monotonic() < deadline, again
        await asyncio.sleep(0.1)
    assert await _post(jserver, "java-demo", {}) == (200, "ok")  # neighbours answered


async def test_the_jvms_stdin_and_stdout_are_not_the_protocol(jserver):
    """Bytes a handler writes to FileDescriptor.out, or a child started with inheritIO() writes or
    reads, go to the log and /dev/null: every call answers, on the same JVM, neighbours included."""
    status, pid = await _post(jserver, "jstdio", {"how": "none"})
    assert status == 200
    assert await _post(jserver, "jstdio", {"how": "raw"}) == (200, pid)
    assert await _post(jserver, "jstdio", {"how": "inherit"}) == (200, pid)

    async def neighbour() -> tuple[int, object]:
        await asyncio.sleep(0.3)  # while the child (before the fix: reading the protocol) lives
        return await _post(jserver, "jstdio", {"how": "none"})
    assert await asyncio.gather(_post(jserver, "jstdio", {"how": "stdin"}), neighbour()) == [(200, pid)] * 2
    assert await _post(jserver, "jstdio", {"how": "none"}) == (200, pid)


async def test_overloaded_handlers_resolve_to_the_jsonobject_one(jserver):
    """Whatever order the JVM lists the overloads in (declared both ways here)."""
    assert await _post(jserver, "jover1", {"a": 1}) == (200, "JsonObject")
    assert await _post(jserver, "jover2", {"a": 1}) == (200, "JsonObject")


async def test_a_write_after_the_handler_returned_throws(jserver):
    async with aiohttp.ClientSession() as s, s.post(jserver.url + INVOKE.format("jlate"), json={}, headers=SSE) as r:
        body = await r.read()
    assert r.status == 200 and b"left a writer" in body
    # the stream ended; the thread it left now writes to it
    assert await _post(jserver, "jlate", {"check": True}) == (
        200, "YRException: stream closed: the invocation has ended")


async def test_instance_concurrency_is_threads_of_one_jvm(jserver):
    (s1, a), (s2, b) = await asyncio.gather(_post(jserver, "jpair", {}), _post(jserver, "jpair", {}))
    assert (s1, s2) == (200, 200) and a["met"] and b["met"]
    assert a["pid"] == b["pid"] and a["thread"] != b["thread"]


async def test_async_invoke_and_runpod_jobs(jserver):
    async with aiohttp.ClientSession() as s:
        async with s.post(jserver.url + INVOKE.format("java-demo"), json={}, headers={"X-Invoke-Type": "async"}) as r:
            assert r.status == 202
            request_id = (await r.json())["requestId"]
        for _ in range(400):
            async with s.get(f"{jserver.url}/serverless/v1/functions/async-results/{request_id}") as r:
                result = await r.json()
            if result["status"] not in ("pending", "running"):
                break
            await asyncio.sleep(0.05)
        assert (result["status"], result["statusCode"], result["respBody"]) == ("completed", 200, "ok")
        async with s.post(f"{jserver.url}/v2/jupper/runsync?wait=20000", json={"input": "runpod"}) as r:
            body = await r.json()
        # a RunPod worker's event is the job, {"id", "input"}: the String parameter gets its JSON text
        assert body["status"] == "COMPLETED", body
        assert json.loads(body["output"]) == {"ID": body["id"].upper(), "INPUT": "RUNPOD"}


async def _deploy(server, manifest: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"{server.url}/admin/v1/functions",
                                                    data=json.dumps(manifest)) as r:
        return r.status, await r.json()


async def test_a_compile_error_names_file_line_and_message(jserver):
    src = jserver.code / "broken \"dir\"" / "pkg"  # a path javac's argument file must quote
    src.mkdir(parents=True)
    (src / "Broken.java").write_text("package pkg;\npublic class Broken {\n    int x = ;\n}\n")
    status, body = await _deploy(jserver, {"name": "jbroken", "runtime": "java17", "handler": "pkg.Broken::h",
                                           "codePath": str(src.parent)})
    assert status == 400, body
    assert "pkg/Broken.java, line 3: illegal start of expression" in body["message"]
    async with aiohttp.ClientSession() as s, s.get(f"{jserver.url}/admin/v1/functions/jbroken") as r:
        assert r.status == 404  # nothing registered


@pytest.mark.parametrize(("handler", "words"), [
    ("javatest.Fns::nope", "class 'javatest.Fns' has no method 'nope'; its methods with a handler signature "
                           "(event, Context): boom(JsonObject, Context)"),
    ("javatest.Fns::notAHandler", "method notAHandler(int) of class 'javatest.Fns' does not take (event, Context)"),
    ("javatest.Fns::tie", "class 'javatest.Fns' has overloads tie(Integer, Context), tie(Long, Context) and none "
                          "is preferred"),
    ("javatest.Missing::handler", "class 'javatest.Missing' not found; classes in codePath: "),
])
async def test_an_unknown_class_or_method_is_refused_naming_it(jserver, handler, words):
    status, body = await _deploy(jserver, {"name": "jbad", "runtime": "java11", "handler": handler,
                                           "codePath": str(JAVA_FNS)})
    assert status == 400 and words in body["message"], body
    if "Missing" in handler:
        assert "javatest.Fns" in body["message"]
    assert await _post(jserver, "java-demo", {}) == (200, "ok")


async def test_openyuanrongs_dotted_handler_and_static_methods(jserver):
    status, body = await _deploy(jserver, {"name": "jstatic", "runtime": "java8", "handler": "javatest.Fns.stat1c",
                                           "codePath": str(JAVA_FNS)})
    assert status == 201, body
    assert await _post(jserver, "jstatic", {}) == (200, "static")
