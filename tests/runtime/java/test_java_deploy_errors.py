"""What a Java deploy says when the machine cannot run Java, and that the server serves the rest."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from runtime.errors import DeployError
from runtime.java.build import find_jdk
from tests.support.servers import DEPLOY, FUNCTIONS

INVOKE = "/serverless/v1/functions/{}/invocations"
DEMO = {"name": "jdemo", "runtime": "java17", "handler": "org.yuanrong.demo.Demo::handler",
        "codePath": str(FUNCTIONS / "java_demo")}


@pytest.fixture
def no_jdk(tmp_path, monkeypatch):
    """PATH with Python's directory only: no javac, no java."""
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("JAVA_HOME", raising=False)


def test_no_jdk_names_what_to_install(no_jdk):
    with pytest.raises(DeployError) as err:
        find_jdk("jdemo")
    assert err.value.status == 400
    assert "no JDK found" in err.value.message
    assert "apt-get install openjdk-17-jdk-headless libgoogle-gson-java" in err.value.message


def test_a_jdk_older_than_17_is_refused(tmp_path, monkeypatch):
    bin_dir = tmp_path / "old"
    bin_dir.mkdir()
    for tool in ("javac", "java"):
        (bin_dir / tool).write_text("#!/bin/sh\necho 'javac 11.0.2' >&2\n")
        os.chmod(bin_dir / tool, 0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(DeployError) as err:
        find_jdk("jdemo")
    assert "'javac 11.0.2'" in err.value.message and "JDK 17 or later" in err.value.message


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK")
def test_missing_gson_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FNSTREAM_GSON_JAR", str(tmp_path / "nope.jar"))
    with pytest.raises(DeployError) as err:
        find_jdk("jdemo")
    assert "gson is not installed" in err.value.message and "libgoogle-gson-java" in err.value.message


async def test_without_a_jdk_a_java_deploy_is_a_400_and_the_rest_serves(no_jdk, make_client, tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy(DEPLOY / "hello.yaml", deploy)
    demo = yaml.safe_load((DEPLOY / "java-demo.yaml").read_text())
    demo["codePath"] = str(FUNCTIONS / "java_demo")
    (deploy / "java-demo.yaml").write_text(yaml.safe_dump(demo))
    (deploy / "hello.yaml").write_text((DEPLOY / "hello.yaml").read_text().replace("../functions", str(FUNCTIONS)))
    client = await make_client(**{"runtime.deployDir": str(deploy), "runtime.codeRoots": [str(FUNCTIONS)]})
    # At start the Java function is left out (logged), the rest deployed.
    assert (await client.post(INVOKE.format("java-demo"), json={})).status == 404
    resp = await client.post(INVOKE.format("hello"), json={})
    assert resp.status == 200 and await resp.json() == "ok"
    resp = await client.post("/admin/v1/functions", data=json.dumps(DEMO))
    body = await resp.json()
    assert resp.status == 400 and "openjdk-17-jdk-headless" in body["message"], body
    assert (await client.post(INVOKE.format("hello"), json={})).status == 200
    assert Path(FUNCTIONS / "java_demo").is_dir()
