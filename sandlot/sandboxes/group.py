"""``sandlot.open_group``: n sandboxes of one spec, set up once (a GRPO group)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandlot.sandboxes")


@asynccontextmanager
async def open_group(
    spec: SandboxSpec | None = None,
    n: int = 8,
    *,
    backend: str | None = None,
    options: BaseModel | dict[str, Any] | None = None,
    **fields: Any,
) -> AsyncIterator[list[Sandbox]]:
    """``n`` started sandboxes of one spec whose set-up ran once:
    ``async with sandlot.open_group(spec, 8) as sandboxes``.

    On a backend with ``supports_snapshot``, one sandbox is opened and set up (environment,
    install steps, ``post_setup_cmd``), frozen with :meth:`Sandbox.snapshot` and closed; the
    ``n`` forks start from its files, concurrently. Each fork is independent: its writes are
    its own, and no process of the set-up runs in it. Elsewhere (the fallback), and when
    freezing fails (logged), the ``n`` sandboxes are each set up from the spec. Leaving the
    block closes them all and deletes the snapshot, also on error and cancellation.

    Args:
        spec: what to open; keyword ``fields`` override its values (as :func:`sandlot.open`).
        n: how many sandboxes, at least 1.
        backend: backend name (as :func:`sandlot.open`).
        options: backend options (as :func:`sandlot.open`).
        **fields: spec fields or backend options (as :func:`sandlot.open`).

    Raises:
        ValueError: ``n`` is below 1, or a keyword is unknown (see :func:`sandlot.open`).
        SandboxStartError, SandboxSetupError: as :meth:`Sandbox.start`, of the set-up sandbox
            or of the first fork that failed (the others are closed).
    """
    if n < 1:
        raise ValueError(f"a group needs at least one sandbox, got n={n}")
    builder = open(backend, spec, options=options, **fields)
    async with AsyncExitStack() as stack:
        snapshot = await _frozen(builder) if builder.supports_snapshot else None
        if snapshot is not None and snapshot.native:
            stack.push_async_callback(snapshot.delete)
            sandboxes = [open(snapshot=snapshot) for _ in range(n)]
        else:
            sandboxes = [open(backend, spec, options=options, **fields) for _ in range(n)]
        for sb in sandboxes:
            stack.push_async_callback(sb.close)
        await _start_all(sandboxes)
        yield sandboxes


async def _frozen(builder: Sandbox) -> Snapshot:
    """Set ``builder`` up, freeze it and close it; a fallback snapshot when freezing fails."""
    async with builder:
        try:
            return await builder.snapshot()
        except SandboxError as exc:
            log.warning(
                "cannot snapshot sandbox %s (%s), setting each sandbox of the group up: %s",
                builder.id,
                builder.name,
                exc,
            )
            return Snapshot(type(builder), builder.spec, builder.options)


async def _start_all(sandboxes: list[Sandbox]) -> None:
    """Start every sandbox concurrently; raise the first failure (the caller closes all)."""
    failures: list[BaseException] = []

    async def start(sb: Sandbox) -> None:
        try:
            await sb.start()
        except Exception as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for sb in sandboxes:
            tg.start_soon(start, sb)
    if failures:
        raise failures[0]
