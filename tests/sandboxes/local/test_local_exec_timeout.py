"""``Sandbox.exec(timeout=...)``: seconds > 0, or ``None`` for no limit. Zero, a negative number
or NaN is refused before anything runs (0 used to stop the command as it started, NaN to fail
inside the backend), naming the argument."""

from __future__ import annotations

import math

import pytest

import sandlot

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("timeout", [0, -1, -0.5, math.nan, -math.inf])
async def test_a_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    sb = sandlot.open("local", isolation="none")  # not started: the check comes first
    with pytest.raises(ValueError, match=r"exec\(timeout=\.\.\.\) must be a positive number"):
        await sb.exec("true", timeout=timeout)


async def test_none_and_a_positive_timeout_run() -> None:
    async with sandlot.open("local", isolation="none") as sb:
        assert (await sb.exec("echo hi", timeout=None)).stdout == "hi\n"
        assert (await sb.exec("echo hi", timeout=30)).stdout == "hi\n"
        assert (await sb.exec("sleep 30", timeout=0.2)).timed_out
