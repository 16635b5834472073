"""fnstream's `runtime` / `frontend` packages and same-named modules: a clear error either way."""
import os
import subprocess
import sys

from tests.support.servers import ROOT, fn, test_config


def test_a_module_named_runtime_earlier_on_sys_path_is_named_at_start(tmp_path):
    (tmp_path / "runtime.py").write_text("SHADOW = True\n")  # `python -m` puts the current directory first
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "frontend.cli", "serve", "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "ShadowedPackageError" in last and str(tmp_path / "runtime.py") in last
    assert str(ROOT / "runtime") in last


def test_without_a_shadow_the_cli_starts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "frontend.cli", "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "init" in out.stdout


async def test_handler_code_with_its_own_runtime_module_is_refused(tmp_path, make_client):
    (tmp_path / "runtime.py").write_text("VALUE = 1\n")
    (tmp_path / "h.py").write_text("import runtime\n\ndef handler(event, context):\n    return runtime.VALUE\n")
    client = await make_client(test_config(**{"runtime.codeRoots": []}))
    resp = await client.post("/admin/v1/functions", json=fn("x", "h.handler", codePath=str(tmp_path)))
    assert resp.status == 400
    message = (await resp.json())["message"]
    assert f"{tmp_path / 'runtime.py'} is shadowed by fnstream's own 'runtime' package" in message
