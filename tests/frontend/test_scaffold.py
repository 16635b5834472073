"""`fnstream init` / `fnstream new`: the files they write, their refusals, the rendered config, and
every template deployed and invoked over a loopback socket (the openai one with the openai SDK)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from openai import AsyncOpenAI

from frontend.scaffold import init_project, new_function, render_config
from frontend.templates import TEMPLATES
from runtime.config import Config, load_config, packaged_default_config
from tests.support.servers import ROOT, read_events

SSE = {"Accept": "text/event-stream"}


def fnstream(*args, cwd):
    return subprocess.run([sys.executable, "-m", "frontend.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_init_writes_a_project_says_what_and_what_next(tmp_path):
    out = fnstream("init", "proj", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    proj = tmp_path / "proj"
    for rel in ("config/default.yaml", "functions/hello.py", "deploy/hello.yaml", "tests/test_hello.py"):
        assert (proj / rel).is_file()
        assert f"created proj/{rel}" in out.stdout
    assert "cd proj && fnstream serve" in out.stdout
    assert (proj / "functions/hello.py").read_text() == (ROOT / "functions/hello.py").read_text()


def test_init_refuses_to_overwrite_naming_the_files_unless_forced(tmp_path):
    init_project(tmp_path)
    (tmp_path / "functions/hello.py").write_text("# mine\n")
    out = fnstream("init", cwd=tmp_path)
    assert out.returncode == 1
    assert "refusing to overwrite" in out.stderr and "functions/hello.py" in out.stderr
    assert "config/default.yaml" in out.stderr and "--force" in out.stderr
    assert (tmp_path / "functions/hello.py").read_text() == "# mine\n"
    assert fnstream("init", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "functions/hello.py").read_text() != "# mine\n"


def test_init_examples_copies_every_bundled_function(tmp_path):
    init_project(tmp_path, examples=True)
    for path in (ROOT / "deploy").glob("*.yaml"):
        assert (tmp_path / "deploy" / path.name).read_text() == path.read_text()
    assert (tmp_path / "functions/chat_backends/standin.py").is_file()


@pytest.fixture
def init_config(tmp_path):
    """An init project's loaded config, written before the loop runs (the CLI never writes on a loop)."""
    init_project(tmp_path)
    return load_config(tmp_path / "config/default.yaml", [f"runtime.dataDir={tmp_path / '.fnstream'}"])


async def test_the_init_project_serves_the_streaming_example_and_its_own_test_passes(tmp_path, init_config,
                                                                                     make_client):
    client = await make_client(config=init_config)
    resp = await client.post("/serverless/v1/functions/hello/invocations", json={}, headers=SSE)
    assert [ev["data"] for _, ev in await read_events(resp)] == ['{"event": "this is a stream"}', '"ok"', "[DONE]"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def _uncommented(text: str) -> str:
    return "\n".join(line[2:] if line.startswith("# ") and ":" in line and not line.startswith("# fnstream")
                     and not line.startswith("# uncomment") and not line.startswith("# Reference") else line
                     for line in text.splitlines())


def test_rendered_config_lists_every_key_and_means_the_shipped_settings(tmp_path):
    text = render_config()
    (tmp_path / "config").mkdir()
    (tmp_path / "config/default.yaml").write_text(text)
    (tmp_path / "config/shipped.yaml").write_text(packaged_default_config().read_text())
    as_rendered = load_config(tmp_path / "config/default.yaml")
    assert as_rendered.model_dump() == load_config(tmp_path / "config/shipped.yaml").model_dump()

    def keys(model, prefix=""):
        for name, field in model.model_fields.items():
            if field.exclude:
                continue
            sub = field.annotation
            yield prefix + name
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                yield from keys(sub, prefix + name + ".")

    # Uncommenting every line turns every key on, each set to its default where the shipped file is silent.
    everything = yaml.safe_load(_uncommented(text))
    for key in keys(Config):
        node = everything
        for part in key.split("."):
            assert part in node, f"{key} missing from the rendered config"
            node = node[part]
    (tmp_path / "config/default.yaml").write_text(_uncommented(text))
    uncommented = load_config(tmp_path / "config/default.yaml")
    assert uncommented.model_dump() == as_rendered.model_dump()


@pytest.mark.parametrize("name", ["9lives", "Upper", "has_underscore", "x" * 64, "runtime", "frontend"])
def test_new_refuses_names_a_manifest_refuses_or_that_fnstream_shadows(tmp_path, name):
    out = fnstream("new", name, cwd=tmp_path)
    assert out.returncode == 1 and "invalid function name" in out.stderr
    assert not (tmp_path / "functions").exists()


def test_new_refuses_to_overwrite_and_prints_the_next_command(tmp_path):
    out = fnstream("new", "my-fn", "--template", "generator", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "created functions/my_fn.py" in out.stdout and "created deploy/my-fn.yaml" in out.stdout
    assert "fnstream invoke my-fn --stream" in out.stdout
    again = fnstream("new", "my-fn", cwd=tmp_path)
    assert again.returncode == 1 and "functions/my_fn.py" in again.stderr and "deploy/my-fn.yaml" in again.stderr


@pytest.fixture
def templates_config(tmp_path):
    """An init project with one function of every template, written before the loop runs."""
    init_project(tmp_path)
    for template in TEMPLATES:
        new_function(tmp_path, f"t-{template}", template)
    return load_config(tmp_path / "config/default.yaml",
                       ["openai.chatFunction=t-openai", f"runtime.dataDir={tmp_path / '.fnstream'}"])


@pytest.fixture
async def project(templates_config, make_client):
    """That project served over a loopback socket."""
    return await make_client(config=templates_config)


def test_every_template_is_tested_below():
    assert set(TEMPLATES) == {"plain", "stream", "generator", "openai", "runpod", "process", "java"}


async def test_plain_template_answers_json(project):
    resp = await project.post("/serverless/v1/functions/t-plain/invocations", json={"name": "you"})
    assert resp.status == 200
    assert await resp.json() == {"greeting": "hello, you", "function": "t-plain"}


@pytest.mark.parametrize("template, event, expect", [
    ("stream", {"count": 3}, [{"event": "this is a stream", "n": i} for i in (1, 2, 3)] + ["ok"]),
    ("generator", {"count": 3}, [{"n": i, "of": 3} for i in (1, 2, 3)]),
    ("runpod", {"input": {"prompt": "one two three"}}, [{"word": w} for w in ("one", "two", "three")]),
])
async def test_streaming_templates_send_each_event_while_the_handler_runs(project, template, event, expect):
    resp = await project.post(f"/serverless/v1/functions/t-{template}/invocations", json=event, headers=SSE)
    assert resp.status == 200
    events = await read_events(resp)
    assert [json.loads(ev["data"]) for _, ev in events[:-1]] == expect and events[-1][1]["data"] == "[DONE]"
    # The handler sleeps between events: the first arrived well before the last was produced.
    assert events[len(expect) - 1][0] - events[0][0] >= 0.15


async def test_runpod_template_runs_as_a_runpod_job(project):
    resp = await project.post("/v2/t-runpod/runsync", json={"input": {"prompt": "one two"}})
    assert resp.status == 200
    body = await resp.json()
    assert body["status"] == "COMPLETED" and body["output"] == [{"word": "one"}, {"word": "two"}]
    stream = await (await project.post(f"/v2/t-runpod/stream/{body['id']}")).json()
    assert stream["stream"] == [{"output": {"word": "one"}}, {"output": {"word": "two"}}]


async def test_process_template_runs_in_a_worker_process(project):
    resp = await project.post("/serverless/v1/functions/t-process/invocations", json={"limit": 100}, headers=SSE)
    data = [ev["data"] for _, ev in await read_events(resp)]
    assert data[-2:] == ['{"primes":25}', "[DONE]"] and len(data) == 6
    described = await (await project.get("/admin/v1/functions/t-process")).json()
    assert described["function"]["status"]["executor"] == "process"


@pytest.mark.skipif(shutil.which("javac") is None or not Path("/usr/share/java/gson.jar").is_file(),
                    reason="needs a JDK (javac) and gson (libgoogle-gson-java)")
async def test_java_template_streams_from_a_worker_jvm(project, templates_config):
    source = Path(templates_config.runtime.codeRoots[0]) / "t_java/t_java/TJava.java"
    assert "public class TJava" in source.read_text()
    resp = await project.post("/serverless/v1/functions/t-java/invocations", json={"count": 2}, headers=SSE)
    assert resp.status == 200
    data = [json.loads(ev["data"]) if ev["data"] != "[DONE]" else None for _, ev in await read_events(resp)]
    assert data == [{"event": "this is a stream", "n": 1}, {"event": "this is a stream", "n": 2},
                    {"count": 2, "function": "t-java"}, None]


async def test_openai_template_streams_chunks_to_the_openai_sdk(project):
    async with AsyncOpenAI(base_url=str(project.make_url("/v1")), api_key="unused", max_retries=0) as sdk:
        messages = [{"role": "user", "content": "hi there"}]
        parts = [c.choices[0].delta.content or "" async for c in
                 await sdk.chat.completions.create(model="t-openai", stream=True, messages=messages)]
        whole = await sdk.chat.completions.create(model="t-openai", messages=messages)
    assert "".join(parts) == "You said: hi there" and len(parts) > 2
    assert whole.choices[0].message.content == "You said: hi there"
