"""``sandlot.open_group``: n sandboxes of one spec, set up once (a GRPO group): one key of a
:class:`~sandlot.sandboxes.setups.cache.SetupCache`, opened with ``fork_first``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from pydantic import BaseModel

from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open
from sandlot.sandboxes.registry import choose_backend
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.sandboxes.spec import SandboxSpec


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
    its own, and no process of the set-up runs in it. Elsewhere (the fallback), when freezing
    fails and for a fork that fails to start (each logged), the sandbox is set up from the
    spec instead. Leaving the block closes them all and deletes the snapshot, also on error
    and cancellation.

    Args:
        spec: what to open; keyword ``fields`` override its values (as :func:`sandlot.open`).
        n: how many sandboxes, at least 1.
        backend: backend name (as :func:`sandlot.open`).
        options: backend options (as :func:`sandlot.open`).
        **fields: spec fields or backend options (as :func:`sandlot.open`).

    Raises:
        ValueError: ``n`` is below 1, or a keyword is unknown (see :func:`sandlot.open`).
        SandboxStartError, SandboxSetupError: as :meth:`Sandbox.start`, of the set-up sandbox
            or of the first sandbox set up from the spec that failed (the others are closed).
    """
    if n < 1:
        raise ValueError(f"a group needs at least one sandbox, got n={n}")
    name = choose_backend(backend).name
    proto = open(name, spec, options=options, **fields)  # validated once, never started
    sandboxes: list[Sandbox] = []
    failures: list[Exception] = []
    async with AsyncExitStack() as stack:
        setups = SetupCache()
        stack.push_async_callback(setups.aclose)

        async def one() -> None:
            try:
                sb = await setups.open(
                    "group", name, proto.spec, proto.options, _as_is, group_size=n, fork_first=True
                )
            except Exception as exc:  # the group fails: the others are cancelled and closed
                failures.append(exc)
                tg.cancel_scope.cancel()
                return
            sandboxes.append(sb)
            stack.push_async_callback(sb.close)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
        if failures:
            raise failures[0]
        yield sandboxes


async def _as_is(sb: Sandbox) -> None:
    """A group's set-up is its spec's, which ``start`` ran."""
