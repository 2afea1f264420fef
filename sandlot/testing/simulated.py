"""``SimulatedSandbox``: a sandbox whose creation is one call to a :class:`SimulatedCloud`.

The simulated provider behaves the way clouds do under a burst of creates (the failure modes
uni-agent reported on Modal at concurrency >= 128, and the 429s of every control plane):

* each create takes ``latency_s`` (+-50 % jitter) once it holds one of ``workers`` provisioning
  slots (``None``: no queue); a create that waited ``queue_timeout_s`` for a slot fails
  ("runtime did not start", retryable);
* with ``burst`` creates in flight it refuses new ones at once (429, retryable);
* ``rate_limited`` is the fraction of creates refused after their latency (429, retryable);
* ``permanent`` (a message) fails every create for good; ``hang`` makes creates never return.

It runs on asyncio (as the cloud SDKs do). Durations are multiplied by ``scale`` (real
seconds per simulated second), so a benchmark can simulate minutes in seconds. A create that
reached the provider finishes even if its caller is cancelled (like a request already sent):
what it made is in ``created`` until the sandbox's close puts it in ``deleted``; ``leaked`` is
the difference.
"""

from __future__ import annotations

import asyncio
import random
from typing import IO, Any, ClassVar, TypeVar

import anyio

from sandlot.errors import (
    SandboxError,
    SandboxFileError,
    SandboxStartError,
)
from sandlot.runtimes.observation import Observation
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.transport import Reader, RunOutput, RunRequest, TreeCaps

T = TypeVar("T")


class SimulatedCloud:
    """The simulated provider; what it saw is in its counters.

    Args:
        latency_s: simulated seconds one create takes (+-50 % jitter).
        rate_limited: fraction of creates refused with a retryable 429 after their latency.
        workers: creates provisioned at once (the rest queue), or ``None`` for no queue.
        queue_timeout_s: simulated seconds a create may queue before failing (with
            ``workers``).
        burst: creates in flight above which new ones are refused at once, or ``None``.
        scale: real seconds per simulated second.
        seed: of the jitter and refusals.

    Attributes:
        in_flight: creates in the provider's hands now; ``peak``: the most at once.
        created / deleted: resource ids made / removed; ``leaked``: made and not removed.
        refused: 429s given; ``timeouts``: creates that queued too long.
        permanent: when set, every create fails with this message, not retryable.
        hang: when ``True``, creates never return.
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.01,
        rate_limited: float = 0.0,
        workers: int | None = None,
        queue_timeout_s: float = 30.0,
        burst: int | None = None,
        scale: float = 1.0,
        seed: int = 1,
    ) -> None:
        self.latency_s = latency_s
        self.rate_limited = rate_limited
        self.workers = workers
        self.queue_timeout_s = queue_timeout_s
        self.burst = burst
        self.scale = scale
        self.rng = random.Random(seed)
        self.in_flight = 0
        self.peak = 0
        self.created: set[str] = set()
        self.deleted: set[str] = set()
        self.refused = 0
        self.timeouts = 0
        self.permanent: str | None = None
        self.hang = False
        # asyncio's, not anyio's: the queue's fairness and timing under a burst of 2,000 waiters
        # shape the benchmark's baseline, whose published figures were measured with it.
        self._slots: asyncio.Semaphore | None = None

    @property
    def leaked(self) -> set[str]:
        """Resources created and never deleted."""
        return self.created - self.deleted

    async def create(self, name: str) -> str:
        """One create call for resource ``name``; returns the resource id (= ``name``).

        Raises:
            SandboxStartError: refused (429, queue timeout: retryable; ``permanent``: not).
        """
        if self.burst is not None and self.in_flight >= self.burst:
            self.refused += 1
            raise SandboxStartError("429 Too Many Requests: create rate limit", retryable=True)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.permanent:
                raise SandboxStartError(self.permanent, retryable=False)
            if self.hang:
                await anyio.sleep(3600)
            if self.workers is not None:
                if self._slots is None:
                    self._slots = asyncio.Semaphore(self.workers)
                try:
                    await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s * self.scale)
                except asyncio.TimeoutError:
                    self.timeouts += 1
                    raise SandboxStartError(
                        f"runtime did not start within {self.queue_timeout_s:g} s", retryable=True
                    ) from None
            try:
                with anyio.CancelScope(shield=True):  # the request is already sent
                    await anyio.sleep(self.latency_s * self.scale * (0.5 + self.rng.random()))
                    if self.rate_limited and self.rng.random() < self.rate_limited:
                        self.refused += 1
                        raise SandboxStartError(
                            "429 Throttling: rate limit exceeded", retryable=True
                        )
                    self.created.add(name)
            finally:
                if self._slots is not None and self.workers is not None:
                    self._slots.release()
        finally:
            self.in_flight -= 1
        return name

    def delete(self, resource: str) -> None:
        """Remove ``resource`` (idempotent)."""
        self.deleted.add(resource)


class InstantSession(BashSession):
    """A shell whose every command succeeds at once, printing nothing."""

    async def _run(
        self, command: str, *, timeout: float | None, idle_timeout: float | None
    ) -> Observation:
        return Observation(output="", exit_code=0)

    async def _interrupt(self) -> None:
        return None

    async def _close(self) -> None:
        return None


class SimulatedSandbox(Sandbox):
    """A sandbox that is one resource of :attr:`cloud`: every command succeeds at once, files
    live in memory (``upload``/``download`` are not simulated).

    Set the class attribute ``cloud`` (or a subclass's) to the provider to simulate.
    """

    name: ClassVar[str] = "simulated"
    cloud: ClassVar[SimulatedCloud] = SimulatedCloud()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resource: str | None = None
        self.attempts = 0
        self._files: dict[str, bytes] = {}

    async def _start(self) -> None:
        self.attempts += 1
        self.resource = await self.cloud.create(f"{self.id}-{self.attempts}")

    async def _close(self) -> None:
        if self.resource is not None:
            self.cloud.delete(self.resource)
            self.resource = None

    async def _run(self, run: RunRequest) -> RunOutput:
        """Exit code 0, no output."""
        return RunOutput(exit_code=0)

    async def _open_shell(self, name: str, config: SessionConfig) -> BashSession:
        return InstantSession(name, config)

    async def _probe(self) -> str | None:
        return None if self.resource is not None else "its resource was deleted"

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """What :meth:`_put_bytes` stored."""
        try:
            return self._files[path]
        except KeyError:
            raise SandboxFileError(f"read_file {path}: no such file (simulated)") from None

    async def _put_bytes(self, path: str, data: bytes) -> None:
        self._files[path] = data

    async def _put_archive(self, parent: str, archive: IO[bytes], target: str) -> None:
        raise SandboxError("upload is not simulated")

    async def _get_archive(self, path: str, caps: TreeCaps, consume: Reader[T]) -> T:
        raise SandboxError("download is not simulated")
