"""Suite-wide hooks.

* The checks of ``@needs(...)`` marks run when each test is set up (``tests/requirements.py``):
  a missing part skips the test, or fails it with ``CI=true``. A module that misses a part at
  import is a collection error under ``CI=true``; the other modules' tests still run there.
* Slow tests (``@pytest.mark.slow``, more than about 3 s) are deselected by the default
  ``-m "not slow"`` of ``pyproject.toml``; ``python -m pytest -q -m ""`` runs every test, and so
  does CI: with ``CI=true`` that default is dropped, so nothing goes untested there. It is
  dropped too when every argument names tests (``path::test``): a slow test asked for runs.
* ``SANDLOT_STATE_DIR`` points at a temporary directory unless set: run logs and leak lists of
  the tests never land in the user's state dir.
"""

from __future__ import annotations

import os
import tempfile

import anyio
import pytest
from requirements import IN_CI, check_marks

DEFAULT_MARKEXPR = "not slow"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SANDLOT_STATE_DIR", tempfile.mkdtemp(prefix="sandlot-test-state-"))
    named = bool(config.args) and all("::" in arg for arg in config.args)
    if config.option.markexpr == DEFAULT_MARKEXPR and (IN_CI or named):
        config.option.markexpr = ""
    if IN_CI:
        config.option.continue_on_collection_errors = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marks(item)


@pytest.fixture
def freezing_hangs(monkeypatch: pytest.MonkeyPatch) -> anyio.Event:
    """Freezing a ``local`` sandbox into a snapshot hangs until it is cancelled; the event is
    set once a freeze has begun."""
    from sandlot.sandboxes.local import LocalSandbox

    freezing = anyio.Event()

    async def hang(self: LocalSandbox) -> str:
        freezing.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(LocalSandbox, "_snapshot", hang)
    return freezing
