"""The README stays the short entry it is meant to be: its two set-up commands first, its first
function runnable as written (the sample is deployed and invoked here, its answer compared)."""
from __future__ import annotations

import re

from tests.support.servers import ROOT

README = (ROOT / "README.md").read_text()


def _blocks(section: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the README's `## section`."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```$", body, flags=re.M | re.S)


def test_the_two_setup_commands_come_first():
    lang, first = re.search(r"^```(\w*)\n(.*?)^```$", README, flags=re.M | re.S).groups()
    assert lang == "sh"
    assert first.splitlines() == [
        "./scripts/serve     # install, then run the server with config/default.yaml and every manifest in deploy/",
        "./scripts/test      # install with test dependencies, then run the whole test suite",
    ]
    for script in ("serve", "test"):
        assert (ROOT / "scripts" / script).stat().st_mode & 0o111


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


async def test_the_first_function_streams_as_shown(make_client, tmp_path):
    blocks = dict(_blocks("A first streaming function")[:2])
    (tmp_path / "functions").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "functions" / "countdown.py").write_text(blocks["python"])
    (tmp_path / "deploy" / "countdown.yaml").write_text(blocks["yaml"])
    shown = next(text for lang, text in _blocks("A first streaming function") if not lang and "[DONE]" in text)
    client = await make_client(**{"runtime.codeRoots": [str(tmp_path / "functions")],
                                  "runtime.deployDir": str(tmp_path / "deploy")})
    resp = await client.post("/serverless/v1/functions/countdown/invocations", json={"from": 3},
                             headers={"Accept": "text/event-stream"})
    assert resp.status == 200
    assert await resp.text() == shown
    resp = await client.post("/serverless/v1/functions/countdown/invocations", json={"from": 1})
    assert await resp.json() == "liftoff"
