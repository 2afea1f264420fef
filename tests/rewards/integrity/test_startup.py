"""Repository code that runs before, or inside, the test runner (issue #25 item 3).

A model patch shadows modules Python and pytest import at start-up (standard-library names,
pytest's dependencies, ``sitecustomize``, a ``.pth``), at the repository's root or in a
directory the instance's environment puts on ``PYTHONPATH``. Each shadow carries a payload that
looks for the channel's key (fd 3, stdin, the environment, the descriptors and memory of its
process and of its parent), writes forged records signed with whatever it found, and rewrites
the channel plugin's hooks. The revert step is turned off, so nothing here depends on its list
of names. Evaluated against swe-mini's ``minicalc__minicalc-1`` on ``local``: the code under
test stays wrong, so only a forgery could resolve it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from integrity_attacks import (
    SHADOW_MARK,
    STARTUP_SHADOWS,
    late_payload,
    make_patch,
    plugin_by_name,
    startup_shadows,
)
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import EVAL, bwrap_missing, need_module, needs

import sandlot.rewards.evaluation as evaluation_module
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.integrity.channel import ChannelRun
from sandlot.rewards.result import ChannelState, EvalResult, EvalStatus

need_module("swebench", EVAL)
pytestmark = needs(bwrap_missing)

EXAMPLES = REPO_EXAMPLES / "swe-mini"
TARGET = "minicalc__minicalc-1"


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("sandboxes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SANDLOT_LOCAL_ROOT", str(root))
        yield root


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    dest = tmp_path_factory.mktemp("repos")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    inst = next(i for i in load_instances(EXAMPLES / "instances.jsonl") if i.instance_id == TARGET)
    return inst.model_copy(update={"repo_source": str(dest / Path(inst.repo_source or "").name)})


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> list[ChannelRun]:
    """The channel runs the evaluator draws (to look for their keys in what the tests saw),
    with the revert step turned off."""
    drawn: list[ChannelRun] = []
    real = evaluation_module.new_channel

    def new_channel() -> ChannelRun:
        drawn.append(real())
        return drawn[-1]

    async def no_revert(*args: Any, **kwargs: Any) -> list[Any]:
        return []

    monkeypatch.setattr(evaluation_module, "new_channel", new_channel)
    monkeypatch.setattr(evaluation_module, "revert_test_infrastructure", no_revert)
    return drawn


def _evaluate(inst: Instance, patch: str, **kwargs: Any) -> EvalResult:
    return anyio.run(lambda: evaluate(inst, patch, backend="local", **kwargs))


def _on_pythonpath(inst: Instance, under: str) -> Instance:
    if not under:
        return inst
    env = dict(inst.env) | {"PYTHONPATH": f"{inst.workdir}/{under.rstrip('/')}"}
    return inst.model_copy(update={"env": env})


CASES = [
    pytest.param(group, under, id=f"{group}-{'PYTHONPATH' if under else 'root'}")
    for under in ("", "lib/")
    for group in STARTUP_SHADOWS
]


@pytest.mark.parametrize(("group", "under"), CASES)
def test_a_repository_shadowing_startup_modules_never_runs_before_or_inside_the_runner(
    group: str,
    under: str,
    target: Instance,
    keys: list[ChannelRun],
    sandbox_root: Path,
    tmp_path: Path,
) -> None:
    inst = _on_pythonpath(target, under)
    names = STARTUP_SHADOWS[group]
    if under:  # on PYTHONPATH, even the interpreter's own start-up modules
        names += ("encodings/__init__.py", "site.py", "os.py")
    patch = make_patch(inst, startup_shadows(inst, names, under), tmp_path / "work")
    result = _evaluate(inst, patch)
    assert result.status is EvalStatus.UNRESOLVED, (result.error, result.log[-3000:])
    assert not result.resolved and result.reward == 0.0
    assert result.reverted_files == []  # the revert step is off: the shadows are all there
    # No shadow ran: not at start-up, not when pytest imported a module lazily later.
    assert SHADOW_MARK not in result.log, (keys[0].key.hex(), result.log[-3000:])
    assert "SANDLOT-SHADOW-KEY" not in result.log
    (run,) = keys
    assert run.key.hex() not in result.log
    # The channel holds pytest's own records: the graded test failed.
    assert result.integrity.channel is ChannelState.VERIFIED, result.integrity
    assert result.FAIL_TO_PASS.failure == inst.FAIL_TO_PASS


@pytest.mark.parametrize(
    "under", [pytest.param("", id="root"), pytest.param("lib/", id="PYTHONPATH")]
)
@pytest.mark.slow
def test_the_shadows_run_under_the_plain_test_command(
    under: str, target: Instance, keys: list[ChannelRun], sandbox_root: Path, tmp_path: Path
) -> None:
    # Guards the test above: without the channel's bootstrap, `python3 -m pytest` imports them.
    inst = _on_pythonpath(target, under)
    patch = make_patch(
        inst, startup_shadows(inst, STARTUP_SHADOWS["stdlib"], under), tmp_path / "work"
    )
    result = _evaluate(inst, patch, integrity_checks=False)
    assert f"{SHADOW_MARK} {under}argparse.py" in result.log, result.log[-3000:]


@pytest.mark.e2e
def test_code_under_test_finds_no_key_and_cannot_forge_or_silence_the_channel(
    target: Instance, keys: list[ChannelRun], sandbox_root: Path, tmp_path: Path
) -> None:
    # The payload run by the code under test, after the channel opened: no key anywhere,
    # forged records are unsigned, the plugin's rewritten hooks leave no end record.
    # -s: what the payload prints during collection reaches the log.
    inst = target.model_copy(update={"test_cmd": f"{target.test_cmd} -s"})
    patch = make_patch(inst, late_payload(inst), tmp_path / "work")
    result = _evaluate(inst, patch)
    assert result.status is EvalStatus.UNRESOLVED, (result.error, result.log[-3000:])
    assert f"{SHADOW_MARK} code under test" in result.log, result.log[-3000:]
    (run,) = keys
    assert run.key.hex() not in result.log
    assert result.integrity.channel is ChannelState.VIOLATED, result.integrity


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="residual risk (docs/reward-integrity.md, section 2): code under test that finds "
    "the plugin's channel object in its own process can sign with it",
)
@pytest.mark.e2e
def test_code_under_test_that_targets_the_plugin_in_memory(
    target: Instance, keys: list[ChannelRun], sandbox_root: Path, tmp_path: Path
) -> None:
    patch = make_patch(target, plugin_by_name(target), tmp_path / "work")
    result = _evaluate(target, patch)
    assert not result.resolved, result.integrity
