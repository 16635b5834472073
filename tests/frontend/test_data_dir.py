"""What a server persists (the SQLite job store, with the functions deployed through the admin API)
lives in its data directory, `runtime.dataDir`: `.fnstream/` where it runs unless set. Nothing goes
beside the config file, so `fnstream serve` in an empty directory writes nothing but `.fnstream/`,
and a test run never meets the checkout's data (see `checkout_data_untouched` in conftest.py)."""
from __future__ import annotations

import json
import os
import urllib.request

import pytest

from runtime.config import load_config
from runtime.jobs.store import SqliteJobStore
from tests.support.servers import ROOT, ServerProcess


def test_the_data_dir_defaults_to_dot_fnstream_where_the_server_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "default.yaml").write_text("frontend: {port: 9999}\n")
    cfg = load_config(tmp_path / "config" / "default.yaml")
    assert cfg.runtime.dataDir == tmp_path / ".fnstream"
    assert cfg.jobs.path == tmp_path / ".fnstream" / "jobs.sqlite3"
    assert load_config(data={}).jobs.path == tmp_path / ".fnstream" / "jobs.sqlite3"


def test_a_relative_data_dir_is_beside_the_config_and_holds_a_relative_jobs_path(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "fn.yaml").write_text("runtime: {dataDir: ../state}\njobs: {path: sub/j.db}\n")
    cfg = load_config(tmp_path / "etc" / "fn.yaml")
    assert cfg.runtime.dataDir == tmp_path / "state"
    assert cfg.jobs.path == tmp_path / "state" / "sub" / "j.db"
    absolute = load_config(tmp_path / "etc" / "fn.yaml", [f"jobs.path={tmp_path / 'elsewhere.db'}"])
    assert absolute.jobs.path == tmp_path / "elsewhere.db"


@pytest.mark.allow_blocking
def test_serve_in_an_empty_directory_writes_only_its_data_dir(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "FNSTREAM_LOG": "WARNING"}
    server = ServerProcess("-s", "runtime.codeRoots=[]", env=env, cwd=tmp_path, own_data_dir=False)
    code = tmp_path.parent / f"{tmp_path.name}-code"
    code.mkdir()
    (code / "hi.py").write_text("def handler(event, context):\n    return 'hi'\n")
    manifest = json.dumps({"name": "hi", "handler": "hi.handler", "codePath": str(code)}).encode()
    try:
        request = urllib.request.Request(server.url + "/admin/v1/functions", data=manifest, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 201  # stored in the job store before the answer
        request = urllib.request.Request(server.url + "/serverless/v1/functions/hi/invocations", data=b"{}",
                                         headers={"X-Invoke-Type": "async"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 202
    finally:
        output = server.stop()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written and all(p == ".fnstream" or p.startswith(".fnstream/") for p in written), (written, output)
    assert (tmp_path / ".fnstream" / "jobs.sqlite3").is_file()


def test_a_job_store_opened_in_the_checkout_fails_the_test():
    with pytest.raises(AssertionError, match="job store in the checkout"):
        SqliteJobStore(ROOT / ".fnstream" / "jobs.sqlite3")
