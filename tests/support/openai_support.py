"""Helpers for the OpenAI-route tests: chat manifests, and parsing SSE bodies."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import yaml

from tests.support.servers import FUNCTIONS

MODEL = "fnstream-standin"


def chat_fn(name: str = "chat", models=(MODEL,), **env) -> dict:
    """A manifest of the bundled chat function with its `environment` overridden."""
    return {"name": name, "handler": "chat.handler", "codePath": str(FUNCTIONS), "timeout": 120,
            "models": list(models), "environment": {k: str(v) for k, v in env.items()}}


def write_deploy(directory: Path, *functions: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "functions.yaml").write_text(yaml.safe_dump(list(functions)))
    return directory


def chat_body(content: str = "Hello there", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def sse_events(body: bytes) -> list[str]:
    """The `data` of each event of a complete SSE body, checking the framing on the way:
    every event is exactly `data: ...` and a blank line (no `id:`/`event:` lines)."""
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    out = []
    for block in text.split("\n\n")[:-1]:
        lines = [ln for ln in block.split("\n") if not ln.startswith(":")]  # heartbeat comments
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        out.append(lines[0][len("data: "):])
    return out


def chunks_of(body: bytes) -> list[dict]:
    data = sse_events(body)
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    return [json.loads(d) for d in data[:-1]]


def content_of(chunks: list[dict]) -> str:
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def admin_function(url: str, name: str, token: str | None = None) -> dict:
    req = urllib.request.Request(f"{url}/admin/v1/functions/{name}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())["function"]


def wait_inflight_zero(url: str, name: str, token: str | None = None, limit: float = 5.0) -> dict:
    """Poll the admin API until the function has nothing in flight; its status then."""
    deadline = time.monotonic() + limit
    while True:
        status = admin_function(url, name, token)["status"]
        if status["inflight"] == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.05)
