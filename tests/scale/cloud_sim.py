"""A fake backend whose creates go to a simulated provider (latency, 429s, hangs)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import anyio

from sandlot import ExecResult, Sandbox, SandboxError, SandboxStartError
from sandlot.sandboxes.base import Command


class Cloud:
    """What the fake provider saw: creates in flight, their peak, every create and delete."""

    def __init__(self, latency_s: float = 0.01, rate_limited: float = 0.0, seed: int = 1) -> None:
        self.latency_s = latency_s
        self.rate_limited = rate_limited
        self.rng = random.Random(seed)
        self.in_flight = 0
        self.peak = 0
        self.created: set[str] = set()
        self.deleted: set[str] = set()
        self.refused = 0
        self.permanent: str | None = None
        self.hang = False

    @property
    def leaked(self) -> set[str]:
        return self.created - self.deleted


class FakeCloudSandbox(Sandbox):
    """A backend whose ``_start`` is a simulated create call against :attr:`cloud`."""

    name: ClassVar[str] = "fake-cloud"
    cloud: ClassVar[Cloud] = Cloud()

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.resource: str | None = None
        self.attempts = 0

    async def _start(self) -> None:
        cloud = self.cloud
        self.attempts += 1
        cloud.in_flight += 1
        cloud.peak = max(cloud.peak, cloud.in_flight)
        try:
            if cloud.permanent:
                raise SandboxStartError(cloud.permanent, retryable=False)
            if cloud.hang:
                await anyio.sleep(3600)
            # The create reaches the provider whatever happens to the caller (like a request
            # already sent): shielded, and recorded before the caller can be cancelled.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(cloud.latency_s * (0.5 + cloud.rng.random()))
                if cloud.rng.random() < cloud.rate_limited:
                    cloud.refused += 1
                    raise SandboxStartError("429 Throttling: rate limit exceeded", retryable=True)
                self.resource = f"{self.id}-{self.attempts}"
                cloud.created.add(self.resource)
        finally:
            cloud.in_flight -= 1

    async def _close(self) -> None:
        if self.resource is not None:
            self.cloud.deleted.add(self.resource)
            self.resource = None

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        self._check_open()
        return ExecResult(exit_code=0)

    async def is_alive(self) -> bool:
        return self._started and not self._closed

    async def read_file(self, path: str) -> bytes:
        raise SandboxError("not supported")

    async def write_file(self, path: str, data: bytes | str) -> None:
        raise SandboxError("not supported")

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        raise SandboxError("not supported")

    async def download(self, remote_path: str, local_path: str | Path) -> None:
        raise SandboxError("not supported")
