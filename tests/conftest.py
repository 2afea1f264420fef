"""Suite-wide hooks.

* The checks of ``@needs(...)`` marks run when each test is set up (``tests/requirements.py``):
  a missing part skips the test, or fails it with ``CI=true``. A module that misses a part at
  import is a collection error under ``CI=true``; the other modules' tests still run there.
* The default run is the cheap tier (docs/testing.md): the ``-m`` of ``addopts`` in
  ``pyproject.toml`` deselects the ``contract``, ``e2e`` and ``slow`` tiers;
  ``python -m pytest -q -m ""`` runs every test, and so does CI: with ``CI=true`` that default
  is dropped, so nothing goes untested there. It is dropped too when every argument names
  tests (``path::test``): a test asked for runs whatever its tier.
* A test runs at most ``timeout`` seconds (pyproject.toml; pytest-timeout), then fails alone
  with its stacks; known-long tests carry their own ``@pytest.mark.timeout(N)``.
* ``SANDLOT_STATE_DIR`` points at a temporary directory unless set: run logs and leak lists of
  the tests never land in the user's state dir.
* CI runs the suite twice, as a new user and then with everything installed (``.ci/run``):
  ``SANDLOT_PASSED_OUT=FILE`` writes the node ids of the tests that passed (every phase), and
  ``SANDLOT_PASSED_IN=FILE`` deselects them, so the second run runs only what the first did
  not pass (skipped, deselected by tier, failed).
* On pytest-xdist workers (``-n 2 --dist loadgroup``, docs/testing.md) the tests of a module
  that touches Ray share the xdist group ``ray`` and so run in turn on one worker
  (:func:`touches_ray`).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from requirements import IN_CI, check_marks


def default_markexpr(config: pytest.Config) -> str | None:
    """The ``-m`` of ``addopts`` in pyproject.toml (the default tier), or ``None``."""
    addopts: list[str] = config.getini("addopts")
    for flag, value in itertools.pairwise(addopts):
        if flag == "-m":
            return value
    return None


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SANDLOT_STATE_DIR", tempfile.mkdtemp(prefix="sandlot-test-state-"))
    named = bool(config.args) and all("::" in arg for arg in config.args)
    if config.option.markexpr == default_markexpr(config) and (IN_CI or named):
        config.option.markexpr = ""
    if IN_CI:
        config.option.continue_on_collection_errors = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marks(item)


_PHASES_PASSED: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("SANDLOT_PASSED_OUT"):
        ok = report.passed and not hasattr(report, "wasxfail")
        if ok and _PHASES_PASSED.get(report.nodeid, 0) >= 0:
            _PHASES_PASSED[report.nodeid] = _PHASES_PASSED.get(report.nodeid, 0) + 1
        else:
            _PHASES_PASSED[report.nodeid] = -1


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("SANDLOT_PASSED_OUT")
    if out:
        with open(out, "w") as f:
            f.writelines(f"{nodeid}\n" for nodeid, n in _PHASES_PASSED.items() if n == 3)


# Starting, joining or looking for a Ray cluster, or running sandlot with --ray.
_RAY_USE = re.compile(r"\bimport ray\b|\bray\.init\(|[\"']--ray[\"']|\bray start\b|RAY_ADDRESS")


@functools.cache
def touches_ray(module: Path) -> bool:
    """Whether the test module at ``module`` uses Ray on this machine.

    Two such tests must not run at once: ``ray.init()`` joins the newest cluster of the machine
    (``ray_current_cluster`` in Ray's temp dir) instead of starting its own, so a second test
    would run inside the first one's cluster and lose its driver when that test shuts the cluster
    down; and a test that asserts there is no cluster would find one.
    """
    return bool(_RAY_USE.search(module.read_text(encoding="utf-8")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".py" and touches_ray(item.path):
            item.add_marker(pytest.mark.xdist_group("ray"))
    passed_file = os.environ.get("SANDLOT_PASSED_IN")
    if not passed_file:
        return
    with open(passed_file) as f:
        passed = set(f.read().splitlines())
    done = [item for item in items if item.nodeid in passed]
    if done:
        config.hook.pytest_deselected(items=done)
        items[:] = [item for item in items if item.nodeid not in passed]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Every ``pytest.mark.anyio`` test and async fixture runs on asyncio (the backend sandlot
    uses); session-scoped so that fixtures of any scope may be async."""
    return "asyncio"


@pytest.fixture
def ssl_contexts_made(monkeypatch: pytest.MonkeyPatch) -> list[ssl.SSLContext]:
    """Every context ``ssl.create_default_context`` makes during the test, in order (each one
    parses the system's CA bundle: what the clients' shared contexts save)."""
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kw: Any) -> ssl.SSLContext:
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    return made


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
