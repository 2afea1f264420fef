"""``Pacer``: spaces the calls of a whole process to a rate-limited API.

A control plane limited per account (veFaaS's ``DescribeSandbox``) is better asked by a process
at a steady rate, first come first go, than by each of hundreds of starting sandboxes on its
own clock. No library found serves every event loop and thread of a process at once (Ray
workers may run several); ``aiolimiter`` is asyncio-only and not thread-safe.
"""

from __future__ import annotations

import threading
import time

import anyio


class Pacer:
    """Spaces the calls of the whole process ``interval_s`` seconds apart: each caller of
    :meth:`wait` reserves the next free instant under a thread lock and sleeps until it."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = 0.0
        self._lock = threading.Lock()

    async def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next)
            self._next = at + self.interval_s
        if at > now:
            await anyio.sleep(at - now)
