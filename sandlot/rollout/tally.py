"""Counting the sandboxes a process has open, for any backend and without its help: the
display's "sandboxes alive", and the check that an interrupted run left none open."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import cast

from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.registry import get_backend, register_backend


class SandboxTally:
    """Sandboxes of one backend opened in this process and not yet closed (see
    :func:`tracked_backend`)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.opened = 0
        self.alive = 0


@contextlib.contextmanager
def tracked_backend(backend: str) -> Iterator[SandboxTally]:
    """Count the sandboxes of ``backend`` opened in this process while the block runs.

    Registers, for the block's duration, a subclass of the backend's class whose ``start``
    counts a sandbox in and whose ``close`` counts it out (every path of ``Sandbox.start``
    that fails closes the sandbox). Nested uses share the outer tally.

    Raises:
        BackendNotFoundError: unknown backend.
    """
    cls = get_backend(backend)
    existing = getattr(cls, "_sandlot_tally", None)
    if isinstance(existing, SandboxTally):
        yield existing
        return
    tally = SandboxTally(backend)
    base_start = cls.start
    base_close = cls.close

    async def start(self: Sandbox) -> None:
        if not self.__dict__.get("_sandlot_counted"):
            self.__dict__["_sandlot_counted"] = True
            tally.opened += 1
            tally.alive += 1
        await base_start(self)

    async def close(self: Sandbox) -> None:
        try:
            await base_close(self)
        finally:
            if self.__dict__.pop("_sandlot_counted", False):
                tally.alive -= 1

    namespace = {
        "start": start,
        "close": close,
        "_sandlot_tally": tally,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    counted = cast("type[Sandbox]", abc.ABCMeta(cls.__name__, (cls,), namespace))
    register_backend(backend, counted)
    try:
        yield tally
    finally:
        register_backend(backend, cls)
