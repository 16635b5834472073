"""Ends the job store refused, kept where a full disk cannot refuse them.

When the store refuses a job's end (a full disk), the job is answered FAILED and its end written
again every second; killed before one of those writes took, the store still said IN_PROGRESS or
IN_QUEUE, so the restart rules ran a job its clients had been told was over, a second time. This
file is allocated at start-up, while there is room, in fixed slots: recording an end overwrites
blocks the file already owns, which needs no free space. At the next start the recorded ends are
applied before the restart rules; a slot is cleared once the store holds the end.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

__all__ = ("EndJournal",)

log = logging.getLogger("fnstream.jobs")

SLOT = 256           # bytes a record: {"id": ..., "error": ...} padded with spaces, then "\n"
SLOTS = 2048         # ends not stored yet at once (512 KiB); past it, an end waits in memory only


class EndJournal:
    """Slots of a preallocated file, one a job whose end is not stored yet. Its I/O runs off the loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._slots: dict[str, int] = {}   # job id -> its slot
        self._free: list[int] = []

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._slots

    async def open(self) -> dict[str, str]:
        """Allocate the file (once, at start) and return the ends recorded before: job id -> error."""
        return await asyncio.get_running_loop().run_in_executor(None, self._open)

    def _open(self) -> dict[str, str]:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("jobs: no journal of unstored job ends at %s: %s", self.path, exc)
            return {}
        try:
            os.posix_fallocate(fd, 0, SLOT * SLOTS)
        except OSError as exc:  # no room even now: an end the store refuses waits in memory only
            log.warning("jobs: cannot allocate the journal of unstored job ends at %s: %s", self.path, exc)
            os.close(fd)
            return {}
        self._fd = fd
        data = os.pread(fd, SLOT * SLOTS, 0)
        ends: dict[str, str] = {}
        for slot in range(SLOTS):
            record = data[slot * SLOT:(slot + 1) * SLOT].strip(b" \n\0")
            try:
                doc = json.loads(record) if record else None
            except ValueError:  # torn by a crash mid-write: the end is lost, the restart rules apply
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("id"), str):
                ends[doc["id"]] = str(doc.get("error", ""))
                self._slots[doc["id"]] = slot
            else:
                self._free.append(slot)
        self._free.reverse()
        return ends

    async def record(self, job_id: str, error: str) -> bool:
        """Keep job `job_id`'s end (FAILED with `error`) on disk; False when there is no room."""
        if self._fd is None:
            return False
        slot = self._slots.get(job_id)
        if slot is None:
            if not self._free:
                return False
            slot = self._slots[job_id] = self._free.pop()
        doc = json.dumps({"id": job_id, "error": error[:160]}, ensure_ascii=True).encode()[:SLOT - 1]
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._write, slot, doc.ljust(SLOT - 1) + b"\n")
        except OSError as exc:
            log.error("jobs: the journal of unstored ends refused job %s: %s", job_id, exc)
            return False
        return True

    async def clear(self, job_id: str) -> None:
        """The store holds the end of `job_id` now."""
        slot = self._slots.pop(job_id, None)
        if slot is None or self._fd is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._write, slot, b" " * (SLOT - 1) + b"\n")
        except OSError as exc:  # recorded again at the next start: applying it then changes nothing
            log.warning("jobs: could not clear job %s from the journal of unstored ends: %s", job_id, exc)
        self._free.append(slot)

    def _write(self, slot: int, data: bytes) -> None:
        assert self._fd is not None
        os.pwrite(self._fd, data, slot * SLOT)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
