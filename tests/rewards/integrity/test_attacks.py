"""Model patches written to fool the grader, evaluated on ``local`` and ``docker`` against the
swe-mini instance ``minicalc__minicalc-1``: none resolves, while the gold patches still resolve
8/8 and the honest wrong patches stay unresolved."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from integrity_attacks import (
    _MAKEREPORT_HOOKWRAPPER,
    ATTACKS,
    RAW_ATTACKS,
    make_patch,
    steal_gold_patch,
)
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, need_module, needs

import sandlot
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rewards.evaluation import evaluate, evaluate_in_sandbox
from sandlot.rewards.predictions import load_predictions
from sandlot.rewards.result import ChannelState, EvalResult, EvalStatus
from sandlot.rewards.runner import RunOutcome, run_evaluation
from sandlot.sandboxes.setups.cache import SetupCache

need_module("swebench", EVAL)

EXAMPLES = REPO_EXAMPLES / "swe-mini"
TARGET = "minicalc__minicalc-1"
# The attacks the issue found resolved before the defences: they run in the default suite.
FROM_THE_ISSUE = ("parent_stdout_exit", "conftest_makereport", "pytest_shadow")
# Round 3 (#33, classes 1 and 2): each resolved before the defences of that round.
ROUND_3 = (
    "late_plugin_in_tmp",
    "late_plugin_in_repository",
    "trace_swaps_test_code",
    "trace_swaps_test_functions",
    "xfail_from_code_under_test",
    "assert_rewrite_reprcompare_xfail",
    "gethookproxy_monkeypatch",
    "frozen_tracer_flips_assert_locals",
    "conftest_set_after_collection",
    "plugin_registered_from_clean_stack",
    "wrapped_chain_swap",
    "pytest_ar_global_xfail",
    "pytest_ar_global_partial_xfail",
    "evaluate_raises_xfailed",
    "pytestmark_conditional_xfail",
    "environ_swaps_obj_during_call",
    "session_instance_gethookproxy",
    "obj_property_swap",
    "items_swapped_in_run_loop",
    "item_class_swapped",
    "space_in_node_id",
    "newline_in_param_id",
)
BACKENDS = [
    pytest.param("local", marks=needs(bwrap_missing)),
    pytest.param("docker", marks=[needs(docker_engine_missing), pytest.mark.slow]),
]


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("sandboxes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SANDLOT_LOCAL_ROOT", str(root))
        yield root


@pytest.fixture(scope="module")
def local_instances(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Instance]:
    dest = tmp_path_factory.mktemp("repos")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    return {
        inst.instance_id: inst.model_copy(
            update={"repo_source": str(dest / Path(inst.repo_source or "").name)}
        )
        for inst in load_instances(EXAMPLES / "instances.jsonl")
    }


def _on(backend: str, inst: Instance) -> Instance:
    """``inst`` for ``backend``: container backends use the test image, which has pytest."""
    if backend == "local":
        return inst
    return inst.model_copy(update={"image": TEST_IMAGE, "environment": None})


def _evaluate(inst: Instance, patch: str, backend: str, **kwargs: Any) -> EvalResult:
    return anyio.run(lambda: evaluate(inst, patch, backend=backend, **kwargs))


# An evaluation: the instance, the patch and evaluate's keyword arguments (backend included).
Job = tuple[Instance, str, dict[str, Any]]
_CHUNK = 8  # the evaluations one item runs: its own and those of the next items like it
_AT_ONCE = 4  # evaluations running at once (sandboxes mostly wait: on git, on pytest's start)


class Evaluations:
    """Each item's own evaluation, run through ``evaluate`` with those of the next items of its
    test and backend (up to ``_CHUNK``, ``_AT_ONCE`` at a time), then handed to each item to
    assert on its own.

    Every evaluation starts from the instance's clean set-up in a sandbox of its own: a fork
    of that set-up (``setups=``, ``fork_first``: what production grading does for a group),
    never a sandbox another patch ran in. Only the items selected in this session are
    evaluated; under xdist (whose workers each hold every item) an item runs alone."""

    def __init__(self, session: pytest.Session) -> None:
        self._session = session
        self._results: dict[str, EvalResult | Exception] = {}

    def result(self, item: pytest.Item, job: Callable[[pytest.Function], Job]) -> EvalResult:
        """``item``'s evaluation; ``job`` gives an item's (also the next items')."""
        if item.nodeid not in self._results:
            jobs: dict[str, Job] = {}
            for other in self._next_like(item):
                try:
                    jobs[other.nodeid] = job(other)
                except Exception as exc:  # making the patch failed: that item's failure
                    self._results[other.nodeid] = exc
            if jobs:
                anyio.run(self._run, jobs)
        got = self._results.pop(item.nodeid)
        if isinstance(got, Exception):
            raise got
        return got

    def _next_like(self, item: pytest.Item) -> list[pytest.Function]:
        """``item`` and the items after it (in run order) of its test and backend."""
        assert isinstance(item, pytest.Function)
        if hasattr(self._session.config, "workerinput"):  # an xdist worker
            return [item]

        same = [
            other
            for other in self._session.items
            if isinstance(other, pytest.Function)
            and other.parent is item.parent
            and other.originalname == item.originalname
            and other.callspec.params.get("backend") == item.callspec.params.get("backend")
            and other.nodeid not in self._results
        ]
        if item not in same:
            return [item]
        return same[same.index(item) :][:_CHUNK]

    async def _run(self, jobs: dict[str, Job]) -> None:
        limit = anyio.CapacityLimiter(_AT_ONCE)
        setups = SetupCache()

        async def one(nodeid: str, inst: Instance, patch: str, kwargs: dict[str, Any]) -> None:
            async with limit:
                self._results[nodeid] = await evaluate(
                    inst, patch, setups=setups, group_size=len(jobs), **kwargs
                )

        try:
            async with anyio.create_task_group() as tg:
                for nodeid, (inst, patch, kwargs) in jobs.items():
                    tg.start_soon(one, nodeid, inst, patch, kwargs)
        finally:
            await setups.aclose()


@pytest.fixture(scope="module")
def evaluations(request: pytest.FixtureRequest, sandbox_root: Path) -> Evaluations:
    return Evaluations(request.session)


def _params(item: pytest.Function) -> tuple[str, str]:
    return item.callspec.params["attack"], item.callspec.params["backend"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "attack",
    [pytest.param(a, marks=() if a in FROM_THE_ISSUE else pytest.mark.slow) for a in ATTACKS],
)
def test_attack_does_not_resolve(
    attack: str,
    backend: str,
    local_instances: dict[str, Instance],
    evaluations: Evaluations,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    def job(item: pytest.Function) -> Job:
        attack, backend = _params(item)
        inst = _on(backend, local_instances[TARGET])
        work = tmp_path_factory.mktemp("work") / "work"
        return inst, make_patch(inst, ATTACKS[attack](inst), work), {"backend": backend}

    result = evaluations.result(request.node, job)
    assert result.status is EvalStatus.UNRESOLVED, (result.error, result.log[-2000:])
    assert not result.resolved and result.reward == 0.0
    # A defence says why: files reverted, the channel rejected, or the log distrusted.
    assert result.integrity.triggered or result.log_warnings, result.model_dump(exclude={"log"})
    assert result.integrity.channel in (ChannelState.VERIFIED, ChannelState.VIOLATED)


# Where each forgery works on the harness's grading alone. On local, a command's parent is the
# jail's init (bash execs the last command of its script), whose stdout is /dev/null: attack (a)
# has no stream to forge there, so it is shown on docker.
FORGERY_BACKENDS = [
    pytest.param(
        "parent_stdout_exit",
        "docker",
        marks=[needs(docker_engine_missing), pytest.mark.slow],
        id="parent_stdout_exit-docker",
    ),
    *(
        pytest.param(a, "local", marks=needs(bwrap_missing), id=f"{a}-local")
        for a in FROM_THE_ISSUE[1:] + ROUND_3
        # [NOTRUN] xfails are not in the plain -rA log the harness grades: it resolved only
        # through the channel's statuses (closed since). A thread racing the run loop may come
        # too late: not a control that holds every time (it is unresolved either way).
        if a not in ("pytestmark_conditional_xfail", "conftest_set_after_collection")
    ),
]


# Checks the attacks themselves (each a real evaluation), not the defences: the e2e tier.
@pytest.mark.e2e
@pytest.mark.parametrize(("attack", "backend"), FORGERY_BACKENDS)
def test_the_attacks_resolve_without_the_defences(
    attack: str,
    backend: str,
    local_instances: dict[str, Instance],
    evaluations: Evaluations,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Guards the attack tests themselves: each forgery works on the harness's grading alone.
    def job(item: pytest.Function) -> Job:
        attack, backend = _params(item)
        inst = _on(backend, local_instances[TARGET])
        patch = make_patch(inst, ATTACKS[attack](inst), tmp_path_factory.mktemp("work") / "w")
        return inst, patch, {"backend": backend, "integrity_checks": False}

    result = evaluations.result(request.node, job)
    assert result.resolved, result.log[-2000:]
    assert result.integrity.channel is ChannelState.UNAVAILABLE


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_gold_resolves_and_wrong_does_not_with_the_defences(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    insts = [_on(backend, i) for i in local_instances.values()]
    runs: dict[str, RunOutcome] = {}

    async def run(name: str) -> None:  # the gold and the wrong run go at once
        runs[name] = await run_evaluation(
            insts,
            load_predictions(EXAMPLES / "predictions" / f"{name}.jsonl", insts),
            run_id=name,
            output_dir=tmp_path,
            backend=backend,
            workers=2,
        )

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "gold")
            tg.start_soon(run, "wrong")

    anyio.run(both)
    gold = runs["gold"]
    assert gold.report["resolved_ids"] == sorted(local_instances), gold.report
    for r in gold.results.values():
        assert r.integrity.channel is ChannelState.VERIFIED and r.integrity.log_consistent
        assert r.reverted_files == [] and r.integrity.violations == []
    assert gold.report["integrity"]["triggered_instances"] == 0
    wrong = runs["wrong"]
    assert wrong.report["resolved_ids"] == [] and wrong.report["error_ids"] == []
    assert wrong.report["unresolved_instances"] == len(insts)


STEAL_BACKENDS = BACKENDS  # on local, the jail's minimal host view hides the datasets

_SCAN = r"""
import json, os, sys
needles = json.loads(sys.argv[1])
found = []
for root, dirs, files in os.walk("/"):
    if root in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        if not name.endswith((".jsonl", ".json", ".parquet", ".patch", ".diff")):
            continue
        try:
            with open(path, errors="replace") as f:
                text = f.read(20_000_000)
        except OSError:
            continue
        if name.endswith(".jsonl") or any(n in text for n in needles):
            found.append(path)
print(json.dumps(found))
"""


@pytest.mark.parametrize("backend", STEAL_BACKENDS)
def test_a_patch_reading_every_jsonl_it_can_find_gets_nothing(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    inst = _on(backend, local_instances[TARGET])
    patch = make_patch(inst, steal_gold_patch(inst), tmp_path / "work")
    result = _evaluate(inst, patch, backend)
    assert not result.resolved, "the gold patch was found and applied during the tests"
    assert result.status is EvalStatus.UNRESOLVED, result.error


@pytest.mark.parametrize("backend", STEAL_BACKENDS)
def test_the_evaluation_sandbox_holds_no_dataset_or_gold_patch(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path
) -> None:
    inst = _on(backend, local_instances[TARGET])
    gold_line = next(
        ln[1:] for ln in inst.patch.splitlines() if ln.startswith("+") and not ln.startswith("++")
    )
    needles = [TARGET, gold_line.strip()]
    spec = sandlot.SandboxSpec(image=inst.image_for(backend), workdir="/tmp")

    async def scan() -> str:
        async with sandlot.open(backend, spec) as sb:
            await sb.write_file("/tmp/scan.py", _SCAN)
            r = await sb.exec(
                ["python3", "/tmp/scan.py", json.dumps(needles)], timeout=600, cwd="/tmp"
            )
            assert r.exit_code == 0, r.stderr
            return r.stdout

    found = json.loads(anyio.run(scan).strip().splitlines()[-1])
    assert found == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", list(RAW_ATTACKS))
def test_the_repository_decides_what_a_patch_changed(
    attack: str,
    backend: str,
    local_instances: dict[str, Instance],
    evaluations: Evaluations,
    request: pytest.FixtureRequest,
) -> None:
    def job(item: pytest.Function) -> Job:
        attack, backend = _params(item)
        inst = _on(backend, local_instances[TARGET])
        return inst, RAW_ATTACKS[attack](inst)[0], {"backend": backend}

    _, (outcome, detail) = RAW_ATTACKS[attack](_on(backend, local_instances[TARGET]))
    result = evaluations.result(request.node, job)
    assert result.status is EvalStatus.UNRESOLVED, (result.error, result.log[-2000:])
    assert not result.resolved and result.reward == 0.0
    if outcome == "reverted":
        assert result.patch_applied, result.error
        assert detail in {r.path for r in result.reverted_files}, result.model_dump(exclude={"log"})
    else:
        assert any(detail in v for v in result.integrity.violations), result.integrity
        assert result.integrity.triggered and result.log_warnings


# What an agent with a shell in the repository plants for the evaluator's git (the same-sandbox
# mode): hooks, core.fsmonitor, core.pager, filters and diff drivers, an include, a hooks path,
# a moved work tree; each would touch a marker. Then changes git would not show: a conftest
# committed, a runner section in a skip-worktree pyproject.toml.
_MARKS = "/tmp/sandlot-marks"
_PLANT = f"""
set -e
mkdir -p {_MARKS}
for h in post-checkout pre-commit post-commit post-index-change reference-transaction \\
         pre-auto-gc fsmonitor-watchman post-merge post-rewrite pre-applypatch; do
  printf '#!/bin/sh\\ntouch {_MARKS}/hook-%s\\n' "$h" > .git/hooks/$h
  chmod +x .git/hooks/$h
done
mkdir -p .githooks && cp .git/hooks/* .githooks/
git config core.hooksPath .githooks
git config core.fsmonitor "touch {_MARKS}/fsmonitor; true"
git config core.pager "touch {_MARKS}/pager; cat"
git config filter.evil.clean "touch {_MARKS}/clean; cat"
git config filter.evil.smudge "touch {_MARKS}/smudge; cat"
git config filter.evil.required true
git config diff.evil.command "touch {_MARKS}/diffcmd; true"
git config diff.evil.textconv "touch {_MARKS}/textconv; cat"
git config diff.external "touch {_MARKS}/external; true"
printf '[core]\\n\\tpager = "touch {_MARKS}/include; cat"\\n' > /tmp/evil.cfg
git config include.path /tmp/evil.cfg
printf '* filter=evil diff=evil\\n' > .gitattributes
printf '* filter=evil diff=evil\\n' > .git/info/attributes
rm -f {_MARKS}/*
cat > conftest.py <<'PY'
{_MAKEREPORT_HOOKWRAPPER}
PY
git -c core.hooksPath=/dev/null -c core.fsmonitor=false add -f conftest.py
git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c user.name=a -c user.email=a@a \\
  commit -qm tests-pass
printf '\\n[tool.pytest.ini_options]\\naddopts = "-p no:randomly"\\n' >> pyproject.toml
git -c core.hooksPath=/dev/null -c core.fsmonitor=false update-index --skip-worktree pyproject.toml
rm -f {_MARKS}/*
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_the_agent_planted_in_git_runs_in_the_same_sandbox(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path
) -> None:
    inst = _on(backend, local_instances[TARGET])

    async def run() -> tuple[EvalResult, str]:
        async with sandlot.open(backend, instance_spec(inst, backend)) as sb:
            await prepare_repo(sb, inst, backend)
            r = await sb.exec(_PLANT, timeout=120, cwd=inst.workdir)
            assert r.exit_code == 0, r.stdout + r.stderr
            # The planted configuration runs under the repository's own git.
            r = await sb.exec(f"git status >/dev/null; ls {_MARKS}", timeout=60, cwd=inst.workdir)
            assert "fsmonitor" in r.stdout and "hook-" in r.stdout, r.stdout + r.stderr
            await sb.exec(f"rm -f {_MARKS}/*", timeout=60)
            result = await evaluate_in_sandbox(sb, inst, "(agent's changes)")
            marks = await sb.exec(f"ls -A {_MARKS}", timeout=60)
            return result, marks.stdout

    result, marks = anyio.run(run)
    assert marks.split() == [], "the evaluator's git ran what the agent planted"
    reverted = {r.path for r in result.reverted_files}
    assert {"conftest.py", "pyproject.toml"} <= reverted, result.model_dump(exclude={"log"})
    assert result.status is EvalStatus.UNRESOLVED and not result.resolved, result.error


@pytest.mark.parametrize("backend", [pytest.param("local", marks=needs(bwrap_missing))])
def test_a_listing_over_the_output_cap_is_read_from_its_file(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path
) -> None:
    # Many new files push the list of changes past a small output cap; the conftest at the
    # end of the list is still found and reverted.
    inst = local_instances[TARGET]
    noise = "".join(
        f"--- /dev/null\n+++ b/minicalc/data/file_{i:04d}_{'x' * 60}.txt\n@@ -0,0 +1 @@\n+{i}\n"
        for i in range(300)
    )
    patch = noise + RAW_ATTACKS["headerless_conftest"](inst)[0]
    result = _evaluate(inst, patch, backend, sandbox_options={"max_output_bytes": 8000})
    assert result.status is EvalStatus.UNRESOLVED, result.error
    assert "conftest.py" in {r.path for r in result.reverted_files}


@pytest.mark.parametrize("backend", [pytest.param("local", marks=needs(bwrap_missing))])
@pytest.mark.parametrize("padding", [0, 100], ids=["small", "over-the-output-cap"])
def test_a_setup_cfg_section_only_pytest_sees_is_reverted(
    backend: str,
    padding: int,
    local_instances: dict[str, Instance],
    sandbox_root: Path,
    tmp_path: Path,
) -> None:
    # "[tool:pytest] # ]" is another section for configparser, [tool:pytest] for pytest; with
    # padding, it also comes after what the sandbox's output cap lets the check read.
    inst = local_instances[TARGET]
    cfg = (
        "[metadata]\n"
        + f"# {'x' * 97}\n" * padding
        + "[tool:pytest] # ]\naddopts = -p minicalc._plugin\n"
    )
    edits = {"minicalc/_plugin.py": _MAKEREPORT_HOOKWRAPPER, "setup.cfg": cfg}
    patch = make_patch(inst, edits, tmp_path / "work")
    result = _evaluate(inst, patch, backend, sandbox_options={"max_output_bytes": 8000})
    reverted = {r.path: r.reason for r in result.reverted_files}
    assert "setup.cfg" in reverted, result.model_dump(exclude={"log"})
    assert ("too large" in reverted["setup.cfg"]) == bool(padding), reverted
    assert result.status is EvalStatus.UNRESOLVED, result.error


@pytest.mark.parametrize("backend", [pytest.param("local", marks=needs(bwrap_missing))])
def test_a_symlink_in_the_way_of_test_patch_is_reverted_even_where_allowed(
    backend: str, local_instances: dict[str, Instance], sandbox_root: Path
) -> None:
    # With ``tests`` exempted by integrity_allow, the symlink replacing it still stands where
    # test_patch writes (git apply would refuse to write through it: an error, not a grade).
    inst = Instance.model_validate(
        {**local_instances[TARGET].model_dump(), "integrity_allow": ["tests", "tests/*"]}
    )
    patch = RAW_ATTACKS["symlink_tests_inside"](inst)[0]
    result = _evaluate(inst, patch, backend)
    assert result.status is EvalStatus.UNRESOLVED, result.error
    reasons = {r.path: r.reason for r in result.reverted_files}
    assert "in the way of the instance's test_patch" in reasons.get("tests", ""), reasons
    assert result.integrity.channel is ChannelState.VERIFIED
