"""`python -m tests.support.previous_worker worker ...`: `fnstream worker` as the version before
answers streams (runtime/cluster/answers.py) behaved, for mixed-version tests: its heartbeat
announces no `answers`, and it writes every terminal entry to the invocation's own stream."""
from __future__ import annotations

import json
import sys
from typing import Any

from frontend.cli import main
from runtime.cluster.worker import QueueConsumer

_done_with = QueueConsumer._done_with


async def _previous_done_with(self: QueueConsumer, inv_id: str, terminal: Any = None, reply: str | None = None) -> None:
    await _done_with(self, inv_id, terminal)  # a `reply` field is unknown to it


async def _previous_announce(self: QueueConsumer) -> None:
    functions = [d.name for d in self.registry.list()] if self.taking else []
    info = json.dumps({"running": len(self._running), "completed": self.completed, "functions": functions})
    await self.redis.set(self.keys.worker(self.id), info, px=int(self.heartbeat * 3000))


QueueConsumer._done_with = _previous_done_with  # type: ignore[method-assign]
QueueConsumer._announce = _previous_announce  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
