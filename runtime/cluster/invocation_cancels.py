"""Cancel by id across frontends (cluster mode): `POST /serverless/v1/invocations/{id}/cancel` may
reach a frontend other than the one answering the invocation (runtime/durable.py keeps its record
there). That one publishes the id on a channel every frontend listens to; the answering frontend
cancels it, so its answer (and kept output) ends with the cancel error and [DONE]. The reader's
tenant is checked where the request arrives (only its own tenant's kept streams can be named)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..tasks import checkpoint
from .settings import REDIS_DOWN, Backoff, ClusterUnavailableError, Keys
from .wire import WireError, decode_cancel

__all__ = ("InvocationCancels",)

log = logging.getLogger("fnstream.cluster")


class InvocationCancels:
    """Send a cancel to every frontend; `listen` runs `cancel_here(id)` for each one received."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.channel = f"{keys.prefix}:invocation-cancel"

    async def send(self, inv_id: str) -> None:
        try:
            await self.redis.publish(self.channel, inv_id)
        except REDIS_DOWN as exc:
            raise ClusterUnavailableError(f"cannot send the cancel: Redis is unreachable ({exc})") from None

    async def listen(self, cancel_here: Callable[[str], None]) -> None:
        backoff = Backoff()
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                backoff.reset()
                while True:
                    msg = await pubsub.get_message(timeout=5.0)
                    checkpoint()
                    if msg is None:
                        continue
                    try:
                        inv_id = decode_cancel(msg["data"])
                    except WireError as exc:
                        log.warning("cluster: refusing a message on %s: %s", self.channel, exc.message)
                        continue
                    cancel_here(inv_id)
            except REDIS_DOWN:
                await backoff.sleep()
            finally:
                await pubsub.aclose()
