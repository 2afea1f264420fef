"""The one backoff of the sandbox layer, on tenacity 9 (https://tenacity.readthedocs.io).

Two shapes: :func:`retry` repeats a call that failed in a way another try may fix (a
``KillSandbox`` throttled while many sandboxes close at once), :func:`poll` repeats a cheap
question until it has an answer (has the command exited yet?). Both wait ``first_s``,
``first_s * factor``, ... at most ``max_s`` seconds between tries, with ``anyio.sleep`` so they
work under any event loop anyio runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_never,
    wait_exponential,
)

T = TypeVar("T")


async def retry(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    first_s: float,
    max_s: float,
    retry_on: Callable[[BaseException], bool],
) -> T:
    """``await fn()``, tried up to ``attempts`` times while it raises an exception for which
    ``retry_on`` is true.

    Raises:
        the last exception of ``fn`` once the tries are used up, or at once one that
        ``retry_on`` rejects.
    """
    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=first_s, max=max_s),
        retry=retry_if_exception(retry_on),
        sleep=anyio.sleep,
        reraise=True,
    )
    return await retrying(_awaiting(fn))


async def poll(
    fn: Callable[[], Awaitable[T | None]], *, first_s: float, max_s: float, factor: float = 2
) -> T:
    """``await fn()`` until it returns something other than ``None``; that value. No limit:
    bound it with a cancel scope (``anyio.move_on_after``). Exceptions of ``fn`` propagate."""
    retrying = AsyncRetrying(
        stop=stop_never,
        wait=wait_exponential(multiplier=first_s, max=max_s, exp_base=factor),
        retry=retry_if_result(lambda value: value is None),
        sleep=anyio.sleep,
    )
    value: T | None = await retrying(_awaiting(fn))
    assert value is not None
    return value


def _awaiting(fn: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    # tenacity awaits only coroutine functions; a lambda or bound ``.aio`` returning an
    # awaitable would be taken for a plain function and its awaitable returned unawaited.
    async def call() -> T:
        return await fn()

    return call
