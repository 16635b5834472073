"""Admin API, manifests and config validation."""
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import yaml

from runtime.config import load_config
from runtime.errors import ConfigError, ManifestError
from runtime.manifest import load_deploy_dir, parse_manifest
from tests.support.servers import HANDLERS, ROOT, test_config


async def test_deploy_list_get_delete(client):
    manifest = yaml.safe_dump({"name": "echo2", "handler": "echo.handler", "codePath": ".",
                               "environment": {"K": 1}, "tenant": "acme", "namespace": "ns1"})
    resp = await client.post("/admin/v1/functions", data=manifest)
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    assert body["function"]["urn"] == "sn:cn:yrk:acme:function:0@ns1@echo2:latest"
    assert body["function"]["environment"] == {"K": "1"}
    resp = await client.get("/admin/v1/functions")
    names = [f["name"] for f in (await resp.json())["functions"]]
    assert "echo2" in names and "hello" in names
    resp = await client.post("/serverless/v1/functions/sn:cn:yrk:acme:function:0@ns1@echo2:latest/invocations",
                             json={"q": 1})
    assert await resp.json() == {"q": 1}
    resp = await client.post("/invocations/acme/ns1/echo2/", json={"r": 2})
    assert await resp.json() == {"r": 2}
    resp = await client.get("/admin/v1/functions/echo2")
    status = (await resp.json())["function"]["status"]
    assert status["invocations"] == 2 and status["inflight"] == 0 and status["kind"] == "sync"
    resp = await client.post("/admin/v1/functions", data=manifest)
    assert resp.status == 409
    resp = await client.delete("/admin/v1/functions/echo2")
    assert resp.status == 200
    resp = await client.post("/serverless/v1/functions/echo2/invocations")
    assert resp.status == 404
    resp = await client.delete("/admin/v1/functions/echo2")
    assert resp.status == 404
    resp = await client.get("/admin/v1/functions/echo2")
    assert resp.status == 404


async def test_deploy_json_list_all_or_nothing(client):
    body = [{"name": "okfn", "handler": "echo.handler"}, {"name": "badfn", "handler": "nomodule.handler"}]
    resp = await client.post("/admin/v1/functions", data=json.dumps(body))
    assert resp.status == 400
    assert "nomodule" in (await resp.json())["message"]
    resp = await client.get("/admin/v1/functions/okfn")
    assert resp.status == 404  # nothing registered


@pytest.mark.parametrize("manifest,needle", [
    ({"name": "x", "handler": "broken_import.handler", "codePath": str(HANDLERS)}, "this_module_does_not_exist"),
    ({"name": "x", "handler": "echo.nothere"}, "no callable 'nothere'"),
    ({"name": "x", "handler": "echo.handler", "codePath": "/etc"}, "outside the allowed code roots"),
    ({"name": "x", "handler": "echo.handler", "codePath": "../.."}, "outside the allowed code roots"),
    ({"name": "Bad_Name", "handler": "echo.handler"}, "field 'name'"),
    ({"name": "x", "handler": "no-dot"}, "field 'handler'"),
    ({"name": "x", "handler": "nodot"}, "handler 'nodot': no module 'nodot'"),  # a RunPod worker module
    ({"name": "x", "handler": "echo"}, "module 'echo' does not call runpod.serverless.start()"),
    ({"name": "x", "handler": "echo.handler", "timeout": -1}, "field 'timeout'"),
    ({"name": "x", "handler": "echo.handler", "concurrency": "many"}, "field 'concurrency'"),
    ({"name": "x", "handler": "echo.handler", "colour": "red"}, "field 'colour': unknown field"),
    ({"handler": "echo.handler"}, "field 'name'"),
])
async def test_bad_manifests_refused(make_client, manifest, needle):
    client = await make_client(test_config(deploy=ROOT / "deploy"))
    resp = await client.post("/admin/v1/functions", data=json.dumps(manifest))
    assert resp.status == 400
    message = (await resp.json())["message"]
    assert needle in message, message
    assert (await (await client.get("/admin/v1/functions/x")).json()).get("function") is None


async def test_admin_errors(client):
    resp = await client.post("/admin/v1/functions", data=b"")
    assert resp.status == 400
    resp = await client.post("/admin/v1/functions", data=b"name: [unclosed")
    assert resp.status == 400 and "not valid YAML" in (await resp.json())["message"]
    resp = await client.put("/admin/v1/functions/echo", data=json.dumps({"name": "other", "handler": "echo.handler"}))
    assert resp.status == 400
    resp = await client.put("/admin/v1/functions/ghost", data=json.dumps({"name": "ghost", "handler": "echo.handler"}))
    assert resp.status == 404
    resp = await client.get("/no/such/route")
    assert resp.status == 404 and "code" in await resp.json()
    resp = await client.get("/serverless/v1/functions/echo/invocations")
    assert resp.status == 405 and "code" in await resp.json()


def test_manifest_error_names_file_function_and_field(tmp_path):
    text = yaml.safe_dump([{"name": "good", "handler": "a.b"}, {"name": "bad", "handler": "a.b", "timeout": "soon"}])
    with pytest.raises(ManifestError) as err:
        parse_manifest(text, "fns.yaml", tmp_path)
    assert "fns.yaml: function #2 (bad): field 'timeout'" in err.value.message


def test_deploy_dir_lists_every_bad_file(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"name": "a", "handler": "no-dot"}))
    (tmp_path / "b.yaml").write_text("name: [")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "c", "handler": "x.y"}))
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"name": "c", "handler": "x.y"}))
    with pytest.raises(ManifestError) as err:
        load_deploy_dir(tmp_path)
    msg = err.value.message
    assert "a.yaml" in msg and "b.yaml" in msg and "'c' is defined in more than one manifest" in msg


def test_config_errors_name_key_and_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("frontend:\n  port: many\n  colour: red\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = err.value.message
    assert str(path) in msg and "'frontend.port'" in msg and "'frontend.colour'" in msg and "integer" in msg
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "default.yaml", ["frontend.args.enableEvent=perhaps"])
    assert "frontend.args.enableEvent" in err.value.message and "boolean" in err.value.message
    with pytest.raises(ConfigError):
        load_config(ROOT / "config" / "default.yaml", ["no-equals-sign"])


def test_config_overrides_and_defaults():
    cfg = load_config(ROOT / "config" / "default.yaml", ["frontend.args.enableEvent=false", "frontend.port=9001"])
    assert cfg.frontend.args.enableEvent is False and cfg.frontend.port == 9001
    assert cfg.frontend.args.maxRequestBodySize == 6 and cfg.frontend.args.heartbeatSeconds == 15
    assert cfg.frontend.args.streamBufferEvents == 100
    assert cfg.runtime.codeRoots == [(ROOT / "functions").resolve()]
    assert cfg.runtime.deployDir == (ROOT / "deploy").resolve()


async def test_a_codepath_outside_the_code_roots_says_how_to_widen_them(tmp_path, make_client):
    """openYuanrong's first example, deployed from its own directory, is refused with the fix."""
    (tmp_path / "hello.py").write_text((ROOT / "functions/hello.py").read_text())
    client = await make_client(test_config())
    resp = await client.post("/admin/v1/functions", json={"name": "x", "handler": "hello.handler",
                                                          "codePath": str(tmp_path)})
    assert resp.status == 400
    message = (await resp.json())["message"]
    assert "runtime.codeRoots" in message and "-s 'runtime.codeRoots=[" in message and str(tmp_path) in message
    # Following the advice works.
    widened = message.split("-s '")[1].split("'")[0].partition("=")[2]
    client = await make_client(test_config(**{"runtime.codeRoots": yaml.safe_load(widened)}))
    resp = await client.post("/admin/v1/functions", json={"name": "x", "handler": "hello.handler",
                                                          "codePath": str(tmp_path)})
    assert resp.status == 201
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frontend.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def _get_function(server, name: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{server.url}/admin/v1/functions/{name}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_cli_deploy_of_a_multi_function_file_is_one_all_or_nothing_request(start_server, tmp_path):
    empty = tmp_path / "deploy"
    empty.mkdir()
    server = start_server("--deploy-dir", str(empty), "-s", f"runtime.codeRoots=[{ROOT / 'functions'},{HANDLERS}]")
    echo = {"handler": "echo.handler", "codePath": str(ROOT / "functions")}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([{"name": "cli-a", **echo},
                                   {"name": "cli-broken", "handler": "broken_import.handler",
                                    "codePath": str(HANDLERS)}]))
    done = _cli("deploy", str(bad), "--url", server.url)
    assert done.returncode == 1 and "this_module_does_not_exist" in done.stdout, done
    assert _get_function(server, "cli-a")[0] == 404  # the good one of the file was not deployed either

    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump([{"name": "cli-a", **echo}]))
    assert _cli("deploy", str(first), "--url", server.url).returncode == 0
    revision = _get_function(server, "cli-a")[1]["function"]["status"]["revision"]

    both = tmp_path / "both.yaml"  # one already deployed (redeployed) and one new, in one request
    both.write_text(yaml.safe_dump([{"name": "cli-a", **echo, "environment": {"v": "2"}},
                                    {"name": "cli-b", **echo}]))
    done = _cli("deploy", str(both), "--url", server.url)
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()  # one line a function: name, URN, executor, revision
    assert [line.split()[0] for line in lines] == ["cli-a", "cli-b"]
    assert all(":function:0@" in line.split()[1] and line.split()[2] == "thread" for line in lines), lines
    done = _cli("deploy", str(both), "--json", "--url", server.url)  # the whole answer, for machines
    assert [f["name"] for f in json.loads(done.stdout)["functions"]] == ["cli-a", "cli-b"]
    _, body = _get_function(server, "cli-a")
    assert body["function"]["environment"] == {"v": "2"} and body["function"]["status"]["revision"] > revision
    assert _get_function(server, "cli-b")[0] == 200
