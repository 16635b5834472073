"""Which configuration `fnstream serve` runs on without --config, and the empty start."""
import json
import urllib.request

import pytest

from frontend.startup import load_cli_config
from runtime.config import packaged_default_config
from runtime.errors import ManifestError
from runtime.node import build_registry
from tests.support.servers import ROOT, ServerProcess


def test_a_local_config_is_used_as_is(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/default.yaml").write_text("frontend: {port: 9999}\nruntime: {deployDir: ../elsewhere}\n")
    cfg = load_cli_config(None, [], cwd=tmp_path)
    assert cfg.frontend.port == 9999 and cfg.runtime.deployDir == tmp_path / "elsewhere"
    with pytest.raises(ManifestError, match="does not exist"):  # a project's own missing deploy dir is an error
        build_registry(cfg)


def test_builtin_defaults_stand_in_for_a_local_config_and_use_a_local_deploy_dir(tmp_path):
    (tmp_path / "deploy").mkdir()
    cfg = load_cli_config(None, [], cwd=tmp_path)
    assert cfg.source == str(packaged_default_config())
    assert cfg.runtime.deployDir == tmp_path / "deploy" and cfg.runtime.codeRoots == [tmp_path / "functions"]
    assert cfg.frontend.args.enableEvent is True  # the shipped settings, not the model's bare defaults


def test_builtin_defaults_without_a_deploy_dir_start_empty_unless_one_was_asked_for(tmp_path):
    assert load_cli_config(None, [], cwd=tmp_path).runtime.deployDir is None
    asked = load_cli_config(None, ["runtime.deployDir=mine"], cwd=tmp_path)
    assert asked.runtime.deployDir == tmp_path / "config/mine"
    assert load_cli_config(str(ROOT / "config/default.yaml"), [], cwd=tmp_path).runtime.deployDir == ROOT / "deploy"


def test_the_checkout_still_serves_its_bundled_functions():
    server = ServerProcess()  # cwd is the checkout: ./config/default.yaml and ./deploy
    try:
        with urllib.request.urlopen(server.url + "/admin/v1/functions") as r:
            names = {f["name"] for f in json.loads(r.read())["functions"]}
        assert {"hello", "ticker", "chat", "echo"} <= names
    finally:
        server.stop()
