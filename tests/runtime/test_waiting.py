"""tests/support/waiting.py: the one bounded wait the tests share."""
from __future__ import annotations

import pytest

from tests.support.waiting import eventually


async def test_returns_the_first_accepted_value_of_a_plain_or_async_probe():
    seen = []

    def probe():
        seen.append(len(seen))
        return seen[-1] if len(seen) >= 3 else 0

    assert await eventually(probe, "three calls", step=0) == 2

    async def aprobe():
        return []

    assert await eventually(aprobe, "an empty answer", accept=lambda v: v is not None) == []


async def test_gives_up_naming_what_and_the_last_value():
    with pytest.raises(AssertionError, match=r"gave up waiting for the sky after 0.05 s \(last: 'grey'\)"):
        await eventually(lambda: "grey", "the sky", limit=0.05, step=0.01, accept=lambda v: v == "blue")
