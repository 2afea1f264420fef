"""The repository's own virtualenv (issue #33 item 3): R2E-Gym's layout puts the test
environment inside the repository (``/testbed/.venv``). A patch that touches it (or any
site-packages, or a path git ignores at ``base_commit``) is refused, and the evaluation's pytest
is the interpreter's own, never another copy inside the repository.

First the bootstrap alone (``python -S <plugin>`` as the channel starts it, on this machine),
then whole evaluations of swe-mini's ``minicalc__minicalc-1`` set up with a ``.venv`` that runs
its tests, on ``local`` (the host, and the test image as a container image) and ``docker``.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from integrity_attacks import (
    COPY_PYTEST,
    NO_ASSERTS,
    SHADOW_MARK,
    VENV_MARK,
    VENV_SETUP,
    VENV_TEST_CMD,
    announcing_shadow,
    venv_rewrite_attack,
)
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import (
    EVAL,
    TEST_IMAGE,
    archived_test_image,
    bwrap_missing,
    docker_engine_missing,
    importable,
    local_image_missing,
    needs,
)

import sandlot
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rewards.evaluation import evaluate, evaluate_in_sandbox
from sandlot.rewards.integrity.channel import PLUGIN_SOURCE, ChannelRun, judge_records
from sandlot.rewards.result import ChannelState, EvalResult, EvalStatus

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"
SITE = f"lib/{PY}/site-packages"
TESTS = """
def test_ok():
    assert "abc" == "abc"


def test_bad():
    assert "abc" == "abd"
"""
HONEST = {"test_a.py::test_ok": "PASSED", "test_a.py::test_bad": "FAILED"}


def _make_venv(project: Path, where: str = ".venv", *, with_pytest: bool = True) -> Path:
    """A virtualenv at ``project/where`` (with a copy of this machine's pytest); its
    site-packages."""
    script = VENV_SETUP if with_pytest else 'python3 -m venv --without-pip "$1"'
    bindir = str(Path(sys.executable).parent)
    subprocess.run(
        ["bash", "-c", script, "venv-setup", where],
        cwd=project,
        check=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin"},
    )
    return project / where / SITE


def _channel(tmp_path: Path) -> ChannelRun:
    token = secrets.token_hex(4)
    run = ChannelRun(
        module=f"sandlot_channel_{token}",
        directory=str(tmp_path / f"channel-{token}"),
        key=secrets.token_bytes(32),
    )
    Path(run.directory).mkdir()
    shutil.copy(PLUGIN_SOURCE, Path(run.directory) / f"{run.module}.py")
    return run


def _run(project: Path, command: str, run: ChannelRun | None) -> tuple[str, dict[str, str], int]:
    """``command`` in ``project``, behind the channel's preamble when ``run`` is given; its
    output, the statuses of the channel (``{}`` without one or with no records) and exit code."""
    done = subprocess.run(
        ["bash", "-c", run.command(command) if run else command],
        cwd=project,
        input=run.stdin if run else b"",
        capture_output=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
    )
    out = (done.stdout + done.stderr).decode()
    records = Path(run.records_path) if run else None
    statuses: dict[str, str] = {}
    if records is not None and records.exists() and records.stat().st_size:
        verdict = judge_records(records.read_text(), run.key)  # type: ignore[union-attr]
        assert verdict.violations == [], out
        statuses = verdict.statuses
    return out, statuses, done.returncode


PYTEST = ".venv/bin/python -m pytest -rA -p no:cacheprovider"
# Modules pytest imports lazily, once the channel is open and the working directory is first
# on sys.path: pdb (pytest_configure), tomllib (pyproject.toml), difflib (a failed == on str).
LAZY = ("pdb.py", "tomllib.py", "difflib.py", "pprint.py")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_a.py").write_text(TESTS)
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    return project


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "plain-command"])
def test_the_pytest_of_a_venv_inside_the_repository_imports_nothing_of_the_repository(
    project: Path, tmp_path: Path, channel: bool
) -> None:
    # R2E-Gym's layout: the interpreter's environment is .venv in the repository. Its pytest is
    # the runner (not the repository's code): what it imports lazily comes from the start-up
    # path, as for a pytest installed outside. The plain command (control) imports the shadows.
    _make_venv(project)
    for name in LAZY:
        (project / name).write_text(announcing_shadow(name))
    out, statuses, _ = _run(project, PYTEST, _channel(tmp_path) if channel else None)
    assert f"{VENV_MARK} {project}/.venv" in out, out
    if channel:
        assert SHADOW_MARK not in out, out
        assert statuses == HONEST, out
    else:
        assert f"{SHADOW_MARK} difflib.py" in out, out


def _copy_pytest(dest: Path) -> None:
    """This machine's pytest, with what it imports, copied into ``dest``."""
    subprocess.run([sys.executable, "-", str(dest)], input=COPY_PYTEST, text=True, check=True)


def _forged_pytest(site: Path) -> None:
    """A pytest in ``site`` (a copy of this machine's) whose asserts are all ``pass``."""
    _copy_pytest(site)
    with open(site / "_pytest" / "assertion" / "rewrite.py", "a") as f:
        f.write(NO_ASSERTS)


@pytest.mark.parametrize(
    ("where", "venv"),
    [
        pytest.param(f".venv2/{SITE}", True, id="second-venv"),
        pytest.param(".venv2/packages", True, id="second-venv-other-dir"),
        pytest.param("vendor/site-packages", False, id="site-packages"),
        pytest.param("vendor/dist-packages", False, id="dist-packages"),
    ],
)
def test_no_pytest_of_another_environment_inside_the_repository_is_taken(
    project: Path, tmp_path: Path, where: str, venv: bool
) -> None:
    # The interpreter's environment (.venv, in the repository) has no pytest; a .pth line in
    # it points to a forged pytest in another environment of the repository. The fallback for
    # "pytest itself is the repository" must not take it: the run fails as without pytest.
    site = _make_venv(project, with_pytest=False)
    if venv:
        _make_venv(project, ".venv2", with_pytest=False)
    _forged_pytest(project / where)
    (site / "elsewhere.pth").write_text(f"{project / where}\n")
    out, statuses, code = _run(project, PYTEST, _channel(tmp_path))
    assert "No module named pytest" in out and code == 1, out
    assert statuses == {}


def test_pytest_itself_as_the_repository_still_runs(project: Path, tmp_path: Path) -> None:
    # Control of the test above: pytest installed from the repository's work tree (src/, a
    # .pth line of the interpreter's environment) is the runner.
    site = _make_venv(project, with_pytest=False)
    _copy_pytest(project / "src")
    (site / "pytest-dev.pth").write_text(f"{project / 'src'}\n")
    out, statuses, code = _run(project, PYTEST, _channel(tmp_path))
    assert statuses == HONEST and code == 1, out


# -- Whole evaluations: minicalc__minicalc-1 whose set-up makes .venv, which runs the tests.

EXAMPLES = REPO_EXAMPLES / "swe-mini"
TARGET = "minicalc__minicalc-1"
SWEBENCH = importable("swebench", EVAL)
TARGETS = [
    pytest.param("local", marks=needs(SWEBENCH, bwrap_missing), id="local"),
    pytest.param(
        "local-image",
        marks=[needs(SWEBENCH, local_image_missing), pytest.mark.slow],
        id="local-image",
    ),
    pytest.param(
        "docker", marks=[needs(SWEBENCH, docker_engine_missing), pytest.mark.slow], id="docker"
    ),
]


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("sandboxes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SANDLOT_LOCAL_ROOT", str(root))
        yield root


@pytest.fixture(scope="module")
def minicalc(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    dest = tmp_path_factory.mktemp("repos")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    inst = next(i for i in load_instances(EXAMPLES / "instances.jsonl") if i.instance_id == TARGET)
    return inst.model_copy(update={"repo_source": str(dest / Path(inst.repo_source or "").name)})


def _with_venv(target: str, inst: Instance) -> tuple[str, Instance]:
    """The backend of ``target`` and ``inst`` set up with a ``.venv`` that runs its tests."""
    update: dict[str, Any] = {"post_setup_cmd": VENV_SETUP, "test_cmd": VENV_TEST_CMD}
    if target == "docker":
        update |= {"image": TEST_IMAGE, "environment": None}
    elif target == "local-image":
        update |= {"image": f"oci-archive:{archived_test_image()}", "environment": None}
    return ("docker" if target == "docker" else "local"), inst.model_copy(update=update)


_PROBE = (
    "import sys, _pytest.assertion.rewrite as m\n"
    "print('lib/python%d.%d/site-packages' % sys.version_info[:2])\n"
    "sys.stdout.write(open(m.__file__).read())\n"
)


_ATTACKS: dict[tuple[str, str], str] = {}


def _attack(backend: str, inst: Instance) -> str:
    """The model patch that makes the venv's pytest rewrite every assert into ``pass``: it
    needs the text of the file the set-up copies (python3's), read in a sandbox (once per
    backend and sandbox spec: the tests of a target share it)."""
    key = (backend, instance_spec(inst, backend).model_dump_json())
    if key not in _ATTACKS:
        _ATTACKS[key] = _probed_attack(backend, inst)
    return _ATTACKS[key]


def _probed_attack(backend: str, inst: Instance) -> str:

    async def probe() -> str:
        async with sandlot.open(backend, instance_spec(inst, backend)) as sb:
            r = await sb.exec(["python3", "-c", _PROBE], timeout=120, cwd="/")
            assert r.exit_code == 0, r.stdout + r.stderr
            return r.stdout

    site, _, text = anyio.run(probe).partition("\n")
    return venv_rewrite_attack(text, f".venv/{site}")


def _evaluate(backend: str, inst: Instance, patch: str, **kwargs: Any) -> EvalResult:
    return anyio.run(lambda: evaluate(inst, patch, backend=backend, **kwargs))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.e2e
def test_a_patch_to_the_repositorys_venv_is_refused(
    target: str, minicalc: Instance, sandbox_root: Path
) -> None:
    backend, inst = _with_venv(target, minicalc)
    result = _evaluate(backend, inst, _attack(backend, inst))
    assert result.status is EvalStatus.UNRESOLVED, (result.error, result.log[-3000:])
    assert not result.resolved and result.reward == 0.0
    (violation,) = result.integrity.violations
    assert "_pytest/assertion/rewrite.py (site-packages)" in violation, violation
    assert violation in result.log_warnings
    assert result.patch_applied and result.tests_status == {}  # refused: no test ran


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.e2e
def test_the_venv_attack_resolves_without_the_defences(
    target: str, minicalc: Instance, sandbox_root: Path
) -> None:
    # Control of the test above: the tests run on the venv's pytest, which the patch forges.
    backend, inst = _with_venv(target, minicalc)
    result = _evaluate(backend, inst, _attack(backend, inst), integrity_checks=False)
    assert f"{VENV_MARK} /testbed/.venv" in result.log, result.log[-3000:]
    assert result.resolved, (result.error, result.log[-3000:])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.e2e
def test_the_gold_patch_resolves_with_the_repositorys_venv(
    target: str, minicalc: Instance, sandbox_root: Path
) -> None:
    backend, inst = _with_venv(target, minicalc)
    result = _evaluate(backend, inst, inst.patch)
    assert result.resolved, (result.error, result.integrity, result.log[-3000:])
    assert f"{VENV_MARK} /testbed/.venv" in result.log, result.log[-3000:]
    assert result.integrity.channel is ChannelState.VERIFIED and result.integrity.log_consistent
    assert result.integrity.violations == [] and result.reverted_files == []


# -- The agent's own sandbox (evaluate_in_sandbox): the environment is the agent's.


def _in_own_sandbox(inst: Instance, agent: str) -> EvalResult:
    """Set ``inst`` up on ``local`` (with its ``.venv``), run ``agent`` (shell) in the
    repository as the agent would have, and grade the sandbox as it is left."""

    async def run() -> EvalResult:
        async with sandlot.open("local", instance_spec(inst, "local")) as sb:
            await prepare_repo(sb, inst, "local")
            r = await sb.exec(agent, timeout=120, cwd=inst.workdir)
            assert r.exit_code == 0, r.stdout + r.stderr
            return await evaluate_in_sandbox(sb, inst, "(the agent's changes)")

    return anyio.run(run)


@needs(SWEBENCH, bwrap_missing)
@pytest.mark.e2e
def test_the_agent_may_change_its_own_venv(minicalc: Instance, sandbox_root: Path) -> None:
    # A fix plus what an agent does to its environment (a package installed, a script, a
    # cache): the venv is left out of its changes, neither refused nor reverted; the cache
    # outside it is still reverted.
    _, inst = _with_venv("local", minicalc)
    fix = inst.patch.replace("'", "'\\''")
    agent = (
        f"set -e\nprintf '%s' '{fix}' | git apply\n"
        "site=$(echo .venv/lib/python3*/site-packages)\n"
        'mkdir "$site/newdep" && touch "$site/newdep/__init__.py" "$site/newdep.pth"\n'
        "printf '#!/bin/sh\\n' > .venv/bin/newdep\n"
        "mkdir -p minicalc/__pycache__ && touch minicalc/__pycache__/stale.cpython-311.pyc\n"
    )
    result = _in_own_sandbox(inst, agent)
    assert result.resolved, (result.error, result.integrity, result.log[-3000:])
    assert [r.path for r in result.reverted_files] == ["minicalc/__pycache__/stale.cpython-311.pyc"]
    assert result.integrity.violations == []


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="residual risk (docs/reward-integrity.md, sections 1 and 2): in its own sandbox the "
    "agent's environment is its own; evaluate (a fresh sandbox) grades training rewards",
)
@needs(SWEBENCH, bwrap_missing)
@pytest.mark.e2e
def test_an_agent_that_forges_its_own_venvs_pytest(minicalc: Instance, sandbox_root: Path) -> None:
    _, inst = _with_venv("local", minicalc)
    rewrite = "$(.venv/bin/python -c 'import _pytest.assertion.rewrite as m; print(m.__file__)')"
    no_asserts = NO_ASSERTS.replace("'", "'\\''")
    result = _in_own_sandbox(inst, f"printf '%s' '{no_asserts}' >> \"{rewrite}\"\n")
    assert not result.resolved, result.integrity
