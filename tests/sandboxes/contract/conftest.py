"""The backend contract suite: every backend runs these very same tests.

Each test takes the ``sandbox`` fixture (a started sandbox, closed afterwards) or
``open_sandbox`` (a factory: ``open_sandbox(**spec_or_option_fields)`` returns a sandbox that is
not started yet), and runs once per entry of :data:`TARGETS`. A target names a backend, the
fields it is opened with, how to tell that it cannot run here (the tests are then skipped with
that reason, or failed with ``CI=true``: see ``tests/requirements.py``), and its capabilities:

* ``kill_from_outside``: an async hook that kills a started sandbox behind its back, the way a
  crash, an OOM kill or ``docker kill`` would. ``None`` skips the ``SandboxDeadError`` test.
* ``isolated``: commands see the sandbox's own paths (``pwd`` is ``spec.workdir``) and the
  network is off by default. ``False`` for ``local`` with ``isolation="none"``.

Adding a backend is a few lines here, for example docker::

    def _docker_unavailable() -> str | None:
        try:
            import docker

            docker.from_env().ping()
        except Exception as exc:
            return f"docker is not usable here: {exc}"
        return None


    async def _docker_kill(sb: Sandbox) -> None:
        import docker

        container = docker.from_env().containers.get(sb.container_id)
        await anyio.to_thread.run_sync(container.kill)


    TARGETS.append(
        ContractTarget(
            id="docker",
            backend="docker",
            fields={"image": "python:3.12-slim"},
            unavailable=_docker_unavailable,
            kill_from_outside=_docker_kill,
        )
    )

Run one target with ``pytest -m contract tests/sandboxes/contract -k docker`` (the contract
suite is a tier of its own, left out of the default run: docs/testing.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from repo_paths import EXAMPLES
from requirements import (
    TEST_IMAGE,
    archived_test_image,
    bwrap_missing,
    docker_engine_missing,
    local_image_missing,
    missing,
)

import sandlot
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.docker import DockerSandbox
from sandlot.sandboxes.local import LocalSandbox


@dataclass(frozen=True)
class ContractTarget:
    """One backend configuration the contract suite runs against.

    Attributes:
        id: test id suffix, e.g. ``"local-bwrap"``.
        backend: registry name given to ``sandlot.open``.
        fields: spec fields and backend options every sandbox of this target is opened with.
        unavailable: returns why the target cannot run on this machine, or ``None``.
        kill_from_outside: async hook that kills a started sandbox from outside, or ``None``.
        isolated: commands see sandbox paths and have no network unless ``network=True``.
    """

    id: str
    backend: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    unavailable: Callable[[], str | None] = lambda: None
    kill_from_outside: Callable[[Sandbox], Awaitable[None]] | None = None
    isolated: bool = True

    def open(self, **fields: Any) -> Sandbox:
        """A new, not yet started sandbox of this target; ``fields`` override ``self.fields``."""
        return sandlot.open(self.backend, **{**self.fields, **fields})

    def require_isolated(self) -> None:
        """Skip the calling test on targets whose commands are not isolated."""
        if not self.isolated:
            pytest.skip(f"{self.id} does not isolate commands")


async def _kill_local_init(sb: Sandbox) -> None:
    # A local sandbox lives as long as its init (the jail's PID 1, or the bare init process):
    # an OOM kill or an operator's `kill -9` of it is how it dies.
    assert isinstance(sb, LocalSandbox) and sb.init_pid is not None
    os.killpg(sb.init_pid, signal.SIGKILL)
    for _ in range(1000):  # returns once it is dead, as `docker kill` does
        if _dead(sb.init_pid):
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"the init of {sb.id} survived SIGKILL")


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


async def _kill_docker_container(sb: Sandbox) -> None:
    import docker

    assert isinstance(sb, DockerSandbox) and sb.container_id is not None
    container = docker.from_env().containers.get(sb.container_id)
    await anyio.to_thread.run_sync(container.kill)


TARGETS: list[ContractTarget] = [
    ContractTarget(
        id="local-bwrap",
        backend="local",
        fields={"isolation": "bwrap"},
        unavailable=bwrap_missing,
        kill_from_outside=_kill_local_init,
    ),
    ContractTarget(
        id="local-none",
        backend="local",
        fields={"isolation": "none"},
        kill_from_outside=_kill_local_init,
        isolated=False,
    ),
    ContractTarget(
        id="local-image",
        backend="local",
        fields={"isolation": "bwrap", "image": f"oci-archive:{archived_test_image()}"},
        unavailable=local_image_missing,
        kill_from_outside=_kill_local_init,
    ),
    ContractTarget(
        id="docker",
        backend="docker",
        fields={"image": TEST_IMAGE, "pull": "never"},
        unavailable=docker_engine_missing,
        kill_from_outside=_kill_docker_container,
    ),
]


def _podman_cli_missing() -> str | None:
    if shutil.which("podman") is None:
        return "the podman CLI is not installed (apt-get install podman)"
    return docker_engine_missing()


def _podman_cli_backend() -> str:
    """Register the example backend of docs/backends.md (examples/podman_backend.py)."""
    path = EXAMPLES / "podman_backend.py"
    module_spec = importlib.util.spec_from_file_location("podman_backend", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sandlot.register_backend("podman-cli", module.PodmanSandbox)
    return "podman-cli"


async def _kill_podman_container(sb: Sandbox) -> None:
    await anyio.run_process(["podman", "kill", sb.id])  # the container is named after it


TARGETS.append(
    ContractTarget(
        id="podman-cli",
        backend=_podman_cli_backend(),
        fields={"image": TEST_IMAGE},
        unavailable=_podman_cli_missing,
        kill_from_outside=_kill_podman_container,
    )
)

# Cloud backends through local fakes: Modal's SDK stand-in; veFaaS's API + a real SWE-ReX.
from cloud_targets import cloud_targets  # noqa: E402

TARGETS += cloud_targets(ContractTarget)


# What ``Sandbox`` itself owns (sandlot/sandboxes/base.py) and no transport can change: these
# tests run on BASE_TARGETS only, a local and a remote-shaped backend; every other test runs
# on every target. A test belongs here only if no transport primitive (``_run``, ``_put_bytes``,
# ``_get_archive``, ``_close``, ...) decides its outcome; each entry says what base code it pins.
BASE_TARGETS = ("local-bwrap", "modal-fake")
BASE_OWNED = {
    "test_duration_is_measured": "Sandbox.exec times the call",
    "test_argv_list_is_quoted": "as_shell quotes an argv list before the transport sees it",
    "test_relative_cwd_is_inside_workdir": "Sandbox.resolve_path",
    "test_relative_paths_are_inside_workdir": "Sandbox.resolve_path",
    "test_upload_of_missing_local_path_fails": "build_archive reads the host path",
    "test_a_planted_link_never_makes_a_later_download_write_outside": (
        "extract_archive writes on the host, whatever archive the transport sends"
    ),
    "test_close_is_idempotent": "Sandbox.close's state machine",
    "test_calls_after_close_raise_dead": "Sandbox._check_usable",
    "test_calls_before_start_raise_dead": "Sandbox._check_usable",
    "test_error_in_body_closes_and_close_stays_safe": "Sandbox.__aexit__",
    "test_post_setup_failure_raises_with_command_and_output": "Sandbox._setup_step",
}
# ``any_session`` (test_contract_session.py) runs each test on the backend's own session
# ("native") and on the exec fallback ("exec"): ExecSession is generic code over ``exec``, which
# the exec tests pin on every target, so its variant runs on BASE_TARGETS only.
SESSION_KINDS = ("native", "exec")
BASE_OWNED_SESSION_KINDS = ("exec",)


def _targets(base_owned: bool) -> list[ContractTarget]:
    return [t for t in TARGETS if not base_owned or t.id in BASE_TARGETS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``target`` (and ``any_session``) per test (see :data:`BASE_OWNED`); each
    item is marked ``contract``, a tier of its own (docs/testing.md)."""
    if "target" not in metafunc.fixturenames:
        return
    base_owned = metafunc.definition.originalname in BASE_OWNED
    if "any_session" in metafunc.fixturenames:
        cases = [
            (kind, t)
            for kind in SESSION_KINDS
            for t in _targets(base_owned or kind in BASE_OWNED_SESSION_KINDS)
        ]
        params = [
            pytest.param(kind, t, id=f"{kind}-{t.id}", marks=pytest.mark.contract)
            for kind, t in cases
        ]
        metafunc.parametrize(("any_session", "target"), params, indirect=True)
    else:
        params = [
            pytest.param(t, id=t.id, marks=pytest.mark.contract) for t in _targets(base_owned)
        ]
        metafunc.parametrize("target", params, indirect=True)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> ContractTarget:
    """The contract target under test (skipped when it cannot run here; failed with CI=true)."""
    chosen: ContractTarget = request.param
    reason = chosen.unavailable()
    if reason:
        missing(reason)
    return chosen


@pytest.fixture
def open_sandbox(target: ContractTarget) -> Callable[..., Sandbox]:
    """Factory of not-yet-started sandboxes of the current target."""
    return target.open


@pytest.fixture
async def sandbox(open_sandbox: Callable[..., Sandbox]) -> AsyncIterator[Sandbox]:
    """A started sandbox of the current target, closed after the test."""
    async with open_sandbox() as sb:
        yield sb


async def _short_timeout(run_trivial: Callable[[], Awaitable[object]], floor_s: float) -> float:
    """A timeout (seconds) for a test whose command must get past its first lines before it is
    stopped: ``floor_s``, or ten times what ``run_trivial()`` (e.g. ``sb.exec("true")``) takes
    right now if that is longer.

    The start of a command (a ``podman exec``, a jail, a round trip to a fake cloud, a Python
    interpreter) is what a loaded machine stretches: a fixed sub-second timeout can then stop
    the command before its first line, and the test would fail for the machine, not the code.
    """
    started = time.monotonic()
    await run_trivial()
    return max(floor_s, 10 * (time.monotonic() - started))


ShortTimeout = Callable[[Callable[[], Awaitable[object]], float], Awaitable[float]]


@pytest.fixture
def short_timeout() -> ShortTimeout:
    """``await short_timeout(run_trivial, floor_s)``: see :func:`_short_timeout`."""
    return _short_timeout


class TickProbe:
    """Detects leftover processes the same way on every backend.

    Put :attr:`command` in front of a command: it starts a background loop that appends a byte
    to a file in the workdir every 50 ms (appending, unlike rewriting, never leaves the file
    empty when the loop is killed). Once the command has been killed (timeout, cancellation),
    :meth:`assert_stopped` checks that the file has stopped growing, i.e. the loop died too.
    """

    command = "(while :; do printf . >> .tick; sleep 0.05; done) & "

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.path = f"{sb.spec.workdir}/.tick"

    async def assert_stopped(self) -> None:
        """Fail unless the loop ran and no longer runs."""
        first = await self.sb.read_file(self.path)
        assert first, "the background loop never ran"
        await anyio.sleep(0.5)
        assert await self.sb.read_file(self.path) == first, "a background process survived"


@pytest.fixture
def tick_probe() -> Callable[[Sandbox], TickProbe]:
    """``tick_probe(sb)`` makes a :class:`TickProbe` for sandbox ``sb``."""
    return TickProbe
