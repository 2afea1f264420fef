"""``Snapshot``: the frozen filesystem of a set-up sandbox, which forks start from.

``await sb.snapshot()`` freezes the files of a started sandbox (not its processes);
``sandlot.open(snapshot=snap)`` opens a *fork* that starts with those files and skips the
set-up (environment, install steps, ``post_setup_cmd``), as many times and as concurrently as
wanted. Each backend supplies one primitive, ``Transport._snapshot`` (and the removal
``_delete_snapshot``); its ``_start`` creates a fork from ``Sandbox.origin``. A backend whose
``supports_snapshot`` is ``False`` returns a *fallback* snapshot (``native`` is ``False``):
its forks are set up again from the spec, with the same API.

Deleting is safe while forks of this process run: ``delete()`` removes the snapshot at once
when none runs, else when the last one closes. A snapshot carries the run's
``sandlot.run_id`` label, so ``sandlot gc --run-id`` removes what a crash left behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Protocol, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxStartError
from sandlot.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandlot.sandboxes")


class Backend(Protocol):
    """What a snapshot needs of the class its forks are made of: the backend's name and its
    ``Transport._delete_snapshot``. Every ``Sandbox`` subclass is one; the protocol keeps this
    module below ``base``, which makes snapshots."""

    name: ClassVar[str]

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None: ...


B = TypeVar("B", bound=Backend)


@dataclass(eq=False)
class Snapshot(Generic[B]):
    """A set-up sandbox's files, frozen (``Snapshot[Sandbox]``: forks are ``Sandbox``es).

    Attributes:
        backend: the class of the sandbox it was taken from; forks are of this class.
        spec: the spec of the sandbox it was taken from (forks take its image and set-up).
        options: that sandbox's backend options (forks default to them).
        handle: the backend's reference (``local``: the snapshot's host directory;
            ``docker``: the committed image's id); ``None`` for a fallback snapshot.
    """

    backend: type[B]
    spec: SandboxSpec
    options: BaseModel
    handle: str | None = None
    _forks: int = field(default=0, repr=False)
    _deleted: bool = field(default=False, repr=False)

    @property
    def native(self) -> bool:
        """``True`` when forks start from the frozen files; ``False`` for the fallback, whose
        forks run the spec's set-up again (``supports_snapshot = False`` backends)."""
        return self.handle is not None

    @property
    def deleted(self) -> bool:
        """``True`` once :meth:`delete` was called."""
        return self._deleted

    async def delete(self) -> None:
        """Remove the snapshot: now when no fork of this process runs, else when the last one
        closes (running forks keep their files). Idempotent; survives cancellation. A fork
        opened after this fails to start. A failure is logged, not raised (``sandlot gc
        --run-id`` removes what is left).
        """
        if self._deleted:
            return
        self._deleted = True
        if self._forks == 0:
            await self._remove()

    def _acquire(self, sandbox_id: str) -> None:
        """A fork starts: count it (the snapshot stays until it closes).

        Raises:
            SandboxStartError: the snapshot was deleted (not retryable).
        """
        if self._deleted:
            raise SandboxStartError(
                f"sandbox {sandbox_id} cannot start from snapshot {self.handle}: it was "
                "deleted; take a new snapshot (or open the sandbox from its spec)",
                retryable=False,
            )
        self._forks += 1

    async def _release(self) -> None:
        """A fork closed: remove the snapshot when it was deleted and this was the last."""
        self._forks -= 1
        if self._deleted and self._forks == 0:
            await self._remove()

    async def _remove(self) -> None:
        if self.handle is None:
            return
        name = self.backend.name
        with anyio.CancelScope(shield=True):
            try:
                await self.backend._delete_snapshot(self.handle, self.options)
            except Exception:
                log.exception(
                    "removing snapshot %s (%s) failed; `sandlot gc --backend %s` removes it",
                    self.handle,
                    name,
                    name,
                )
