"""Servers and process workers are subreapers (runtime/fork_guard.py): a handler's detached grandchild
that ends is reaped while they run, not left a zombie until they exit; and the reaper takes no
exit status that someone waits for (a handler's subprocess, asyncio's child watcher). Real servers
over real sockets; processes read from /proc."""
from __future__ import annotations

from pathlib import Path

from tests.frontend.test_forking_handlers import _invoke, _serve
from tests.support.servers import fn
from tests.support.waiting import eventually


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, None once it is gone (reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


async def test_an_adopted_grandchild_that_ends_is_reaped_by_the_server_and_by_a_worker(start_server, deploy_dir,
                                                                                       tmp_path):
    server = _serve(start_server, deploy_dir, tmp_path, fn("detach", "runaway_fns.detaches", timeout=10),
                    fn("pdetach", "runaway_fns.detaches", timeout=10, executor="process", instances=1))
    for name in ("detach", "pdetach"):
        orphan = _invoke(server, name, {"linger": 0.5})
        assert isinstance(orphan, int)
        # Its parent exited at once: it is adopted by the subreaper (the server, or the worker)...
        adopter = await eventually(lambda: _stat(orphan), f"{name}'s orphan adopted",  # noqa: B023
                                   accept=lambda s: s is None or s[0] == "Z" or s[1] != 1)
        if name == "detach" and adopter is not None:
            assert adopter[1] == server.pid, adopter
        # ... and once it ends, reaped while the server runs: no zombie left behind.
        await eventually(lambda: _stat(orphan) is None, f"{name}'s ended orphan reaped",  # noqa: B023
                         accept=bool)
    assert server.proc.poll() is None


async def test_the_reaper_takes_no_exit_status_someone_waits_for(start_server, deploy_dir, tmp_path):
    server = _serve(start_server, deploy_dir, tmp_path, fn("later", "runaway_fns.exit_status_later", timeout=20),
                    fn("alater", "runaway_fns.async_exit_status", timeout=20),
                    fn("plater", "runaway_fns.exit_status_later", timeout=20, executor="process", instances=1))
    # Each child lies dead for longer than the reaper waits before it reaps a zombie nobody collects.
    assert _invoke(server, "later", {"code": 7, "wait": 4}) == 7
    assert _invoke(server, "plater", {"code": 9, "wait": 4}) == 9
    assert _invoke(server, "alater", {"code": 5, "wait": 4}) == 5
