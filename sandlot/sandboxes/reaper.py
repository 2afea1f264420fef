"""Finding and killing sandboxes that runs left behind (``sandlot gc``).

Every remote backend labels its sandboxes (:mod:`sandlot.sandboxes.labels`). A :class:`Reaper`
lists the sandboxes of one backend that carry the ``sandlot.run_id`` label and kills one (a
backend's ``Sandbox`` class that implements the transport's listing primitives gets
:class:`SandboxReaper`);
:func:`select` filters them (``run_id``, minimum age, ``sandlot.owner``) and
:func:`kill_selected` kills a selection concurrently, each kill guarded so one failure never
stops the others; :func:`reap` does the three. :func:`reap_leaked` kills exactly the sandboxes
of a run's leak list (:mod:`sandlot.sandboxes.leaks`).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from pydantic import ValidationError

from sandlot.errors import BackendNotFoundError, SandboxError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.labels import RUN_ID, SANDBOX_ID
from sandlot.sandboxes.leaks import Leak
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.transport import RemoteSandbox, Transport

log = logging.getLogger("sandlot.sandboxes.gc")

_KILL_CONCURRENCY = 16
_KILL_ATTEMPTS = 2


class Reaper(Protocol):
    """Lists and kills the labelled sandboxes of one backend."""

    backend: str

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Sandboxes carrying a ``sandlot.run_id`` label (only ``run_id``'s when given)."""
        ...

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Destroy ``sandbox``; an already gone sandbox is not an error."""
        ...


class SandboxReaper:
    """The reaper of a backend whose ``Sandbox`` class implements the transport's listing
    primitives (``_reaper_context``, ``_list_labelled``, ``_kill_listed``).

    The labels of every listed row are checked here: a platform that ignores the filter must
    not make gc kill another run's sandboxes.

    Args:
        sandbox_cls: the backend's ``Sandbox`` class.
        **options: fields of its options model (credentials, app, functions...).

    Raises:
        SandboxError: ``options`` do not fit the options model.
        BackendUnavailableError: SDK or credentials missing.
    """

    def __init__(self, sandbox_cls: type[Sandbox], **options: Any) -> None:
        self.backend = sandbox_cls.name
        self._cls = sandbox_cls
        try:
            validated = sandbox_cls.Options(**options)
        except ValidationError as exc:
            raise SandboxError(f"gc options of backend {self.backend}: {exc}") from exc
        self._context = sandbox_cls._reaper_context(validated)

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Live sandboxes with a ``sandlot.run_id`` label (= ``run_id`` if given)."""
        listed = await self._cls._list_labelled(self._context, run_id)
        return [sb for sb in listed if RUN_ID in sb.labels and run_id in (None, sb.run_id)]

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Destroy ``sandbox``; an already gone sandbox is not an error."""
        await self._cls._kill_listed(self._context, sandbox)


@dataclass
class GcReport:
    """What :func:`reap` found and did.

    Attributes:
        selected: sandboxes that matched the filters.
        killed: those killed (empty on a dry run).
        failed: ``(sandbox, error message)`` for kills that failed twice.
    """

    selected: list[RemoteSandbox] = field(default_factory=list)
    killed: list[RemoteSandbox] = field(default_factory=list)
    failed: list[tuple[RemoteSandbox, str]] = field(default_factory=list)


def get_reaper(backend: str, **options: Any) -> Reaper:
    """The reaper of ``backend``, any registered backend, built with ``options``: the class its
    ``reaper`` attribute names, else a :class:`SandboxReaper` over its listing primitives.

    Raises:
        BackendNotFoundError: no backend has that name, or it has neither.
        BackendUnavailableError: its SDK is missing or it has no credentials.
        SandboxError: ``options`` do not fit its options model.
    """
    cls = get_backend(backend)
    if cls.reaper is not None:
        module, _, attr = cls.reaper.partition(":")
        reaper: Reaper = getattr(importlib.import_module(module), attr)(**options)
        return reaper
    if cls._list_labelled.__func__ is not Transport._list_labelled.__func__:  # type: ignore[attr-defined]
        return SandboxReaper(cls, **options)
    raise BackendNotFoundError(
        f"backend {backend!r} has no reaper (neither a `reaper` class nor the listing "
        "primitives `_list_labelled`/`_kill_listed`), so sandlot gc cannot list its "
        "sandboxes; see docs/backends.md"
    )


def select(
    sandboxes: Iterable[RemoteSandbox],
    *,
    run_id: str | None = None,
    older_than_s: float | None = None,
    owner: str | None = None,
    now: float | None = None,
) -> list[RemoteSandbox]:
    """The sandboxes of ``run_id`` (any run if ``None``) created at least ``older_than_s`` ago
    whose ``sandlot.owner`` label is ``owner`` (any owner if ``None``).

    A sandbox without a readable ``sandlot.created_at`` never matches an age filter, one
    without an owner label never matches an owner filter.
    """
    now = time.time() if now is None else now
    chosen = []
    for sb in sandboxes:
        if run_id is not None and sb.run_id != run_id:
            continue
        if owner is not None and sb.owner != owner:
            continue
        if older_than_s is not None:
            created = sb.created_at
            if created is None or now - created < older_than_s:
                continue
        chosen.append(sb)
    return chosen


async def reap(
    reaper: Reaper,
    *,
    run_id: str | None = None,
    older_than_s: float | None = None,
    owner: str | None = None,
    dry_run: bool = False,
) -> GcReport:
    """List, filter (:func:`select`) and, unless ``dry_run``, kill (:func:`kill_selected`)."""
    listed = await reaper.list_sandboxes(run_id)
    selected = select(listed, run_id=run_id, older_than_s=older_than_s, owner=owner)
    if dry_run:
        return GcReport(selected=selected)
    return await kill_selected(reaper, selected)


async def kill_selected(reaper: Reaper, selected: list[RemoteSandbox]) -> GcReport:
    """Kill exactly ``selected`` (what a user confirmed), concurrently; every kill is tried
    twice, independently, so one failure never stops the others."""
    report = GcReport(selected=selected)
    limiter = anyio.CapacityLimiter(_KILL_CONCURRENCY)

    async def kill_one(sb: RemoteSandbox) -> None:
        async with limiter:
            error = ""
            for _ in range(_KILL_ATTEMPTS):
                try:
                    await reaper.kill(sb)
                    report.killed.append(sb)
                    return
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("gc: killing %s sandbox %s failed: %s", sb.backend, sb.id, error)
            report.failed.append((sb, error))

    async with anyio.create_task_group() as tg:
        for sb in selected:
            tg.start_soon(kill_one, sb)
    return report


async def reap_leaked(reaper: Reaper, leaked: list[Leak]) -> tuple[GcReport, list[Leak]]:
    """Kill exactly the sandboxes of ``leaked`` (entries of ``reaper``'s backend) that its
    listing still shows, matched by the ``sandlot.sandbox_id`` label or the backend's id.

    Returns:
        The :class:`GcReport` of the kills, and the entries now gone (killed, or no longer
        listed): those a leak list can forget. Entries whose kill failed are in neither.
    """
    listed: list[RemoteSandbox] = []
    for run in sorted({leak.run_id for leak in leaked}):
        listed += await reaper.list_sandboxes(run)
    wanted = {key for leak in leaked for key in _keys(leak.sandbox_id, leak.backend_id)}
    report = await kill_selected(
        reaper, [sb for sb in listed if _keys(sb.id, sb.labels.get(SANDBOX_ID)) & wanted]
    )
    failed = {key for sb, _ in report.failed for key in _keys(sb.id, sb.labels.get(SANDBOX_ID))}
    gone = [leak for leak in leaked if not _keys(leak.sandbox_id, leak.backend_id) & failed]
    return report, gone


def _keys(*ids: str | None) -> set[str]:
    return {i for i in ids if i}
