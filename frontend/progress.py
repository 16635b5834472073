"""A live status line for `fnstream invoke --stream` / `subscribe`, only on a terminal.

When stdout is a TTY, a spinner, the count of lines received and the elapsed time sit on the last
line and are redrawn around every output line (and ten times a second while waiting); when stdout
is a pipe or a file, nothing but the output itself is written.
"""
from __future__ import annotations

import asyncio
import sys
import time
from types import TracebackType
from typing import Self, TextIO

__all__ = ("LiveStatus",)

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_CLEAR = "\r\033[K"


class LiveStatus:
    """Use `async with LiveStatus(label) as status:` and send every output line through `status`."""

    def __init__(self, label: str, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.count = 0
        self._frame = 0
        self._start = time.monotonic()
        self._ticker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        if self.enabled:
            self._draw()
            self._ticker = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self.enabled:
            self.stream.write(_CLEAR)
            self.stream.flush()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self._frame += 1
            self._draw()

    def _draw(self) -> None:
        spin = _SPINNER[self._frame % len(_SPINNER)]
        self.stream.write(f"{_CLEAR}{spin} {self.label}: {self.count} line{'s' if self.count != 1 else ''}, "
                          f"{time.monotonic() - self._start:.1f}s")
        self.stream.flush()

    def print(self, text: str) -> None:
        """One output line, with the status line redrawn under it."""
        self.write_bytes((text + "\n").encode())

    def note(self, text: str) -> None:
        """A message for stderr (not counted), with the status line kept out of its way."""
        if self.enabled:
            self.stream.write(_CLEAR)
            self.stream.flush()
        print(text, file=sys.stderr, flush=True)
        if self.enabled:
            self._draw()

    def write_bytes(self, data: bytes) -> None:
        """Raw output (e.g. a binary element) followed by the status line."""
        self.count += 1
        if self.enabled:
            self.stream.write(_CLEAR)
            self.stream.flush()
        self.stream.buffer.write(data) if hasattr(self.stream, "buffer") else self.stream.write(data.decode())
        self.stream.flush()
        if self.enabled:
            self._draw()
