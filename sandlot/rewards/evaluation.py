"""``evaluate``: SWE-bench style test-patch evaluation of one ``model_patch`` in a fresh sandbox.

Steps, as in the SWE-bench harness (``swebench.harness.run_evaluation.run_instance``): open a
sandbox for the instance; bring the repository to ``base_commit``; apply the model patch with
the harness's fallbacks; reset the files ``test_patch`` touches; apply ``test_patch``; run the
test command; parse its log with ``swebench``'s parser; grade with ``swebench``'s grading.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo, repository_step
from sandlot.datasets.swebench_specs import resolve_log_parser, resolve_test_cmd
from sandlot.errors import (
    EnvironmentBuildError,
    SandboxError,
    SandboxFileError,
    SandboxSetupError,
)
from sandlot.rewards.grading import grade
from sandlot.rewards.integrity.changes import (
    APPLIED,
    LISTING,
    LISTING_START,
    Changes,
    apply_script,
    gnu_patch_paths,
    parse_apply_output,
    parse_working_changes,
    refused_names,
    working_changes_script,
)
from sandlot.rewards.integrity.channel import (
    ChannelRun,
    channel_unavailable,
    judge_records,
    new_channel,
)
from sandlot.rewards.integrity.grade import grade_channel
from sandlot.rewards.integrity.grader_files import (
    END_MARKER,
    GraderFilesError,
    changed_grader_files,
    hash_script,
    parse_hashes,
)
from sandlot.rewards.integrity.revert import RevertError, revert_test_infrastructure
from sandlot.rewards.missing_runner import missing_runner
from sandlot.rewards.result import (
    ChannelState,
    EvalFailure,
    EvalResult,
    EvalStatus,
    Integrity,
    RevertedFile,
)
from sandlot.rewards.scripts import (
    EVAL_DIR,
    MODEL_PATCH_PATH,
    PATCH_APPLY_COMMANDS,
    TEST_PATCH_PATH,
    apply_test_patch_script,
    patch_files,
    reset_test_files_script,
)
from sandlot.sandboxes.base import Sandbox, output_tail
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.sandboxes.registry import choose_backend, get_backend
from sandlot.sandboxes.setups.cache import SetupCache, setup_key
from sandlot.sandboxes.setups.counts import SetupCounts
from sandlot.tools.trusted_git import TrustedGit

log = logging.getLogger("sandlot.rewards")

_STEP_TIMEOUT_S = 600.0
_INLINE_NAMES_MAX = 32_000


class _EvalError(Exception):
    """A step failed in a way that makes the instance an ``error`` (message says which)."""

    def __init__(self, status: EvalStatus, message: str, failure: EvalFailure) -> None:
        super().__init__(message)
        self.status = status
        self.failure = failure


async def evaluate(
    instance: Instance,
    model_patch: str | None,
    *,
    backend: str | None = None,
    model_name_or_path: str = "",
    timeout: float | None = None,
    sandbox_options: BaseModel | dict[str, Any] | None = None,
    integrity_checks: bool = True,
    setups: SetupCache | None = None,
    group_size: int | None = None,
    test_empty: bool = False,
) -> EvalResult:
    """Evaluate ``model_patch`` on ``instance`` in a fresh sandbox and grade it.

    Never raises for a bad patch, a failing setup or a dead sandbox: those become an
    ``EvalResult`` with an error status, so one instance never takes down a batch. Only
    cancellation propagates, after the sandbox is closed.

    Args:
        instance: the task; ``test_cmd`` and ``log_parser`` default from ``swebench`` specs.
        model_patch: a unified diff against ``base_commit``; empty or ``None`` is ``empty_patch``.
        backend: sandbox backend name (``None``: as
            :func:`~sandlot.sandboxes.registry.choose_backend` chooses).
        model_name_or_path: recorded in the result.
        timeout: seconds allowed for the test command; defaults to ``instance.eval_timeout``.
        sandbox_options: backend-specific options passed to ``sandlot.open``.
        integrity_checks: revert the model's changes to test infrastructure and grade pytest
            runs from sandlot's channel (``docs/reward-integrity.md``). ``False`` grades as
            the SWE-bench harness does; only for measuring what the checks cost.
        setups: share the instance's clean set-up with the other evaluations of it (a
            :class:`~sandlot.sandboxes.setups.cache.SetupCache`, opened with ``fork_first``, so
            the patch is applied in a fork of the clean set-up, never in the snapshotted
            sandbox); ``timings_s["setup"]`` then covers the fork's start, and the result's
            ``setup`` says whether this evaluation set the instance up, forked it, or both.
        group_size: how many evaluations of the instance open through ``setups`` (its
            ``group_size``: the snapshot goes once they all opened).
        test_empty: run the tests for an empty ``model_patch`` too (the repository as it is
            at ``base_commit``, with ``test_patch``: ``sandlot data selftest``'s run before the
            fix) instead of returning ``empty_patch`` without a sandbox.

    Returns:
        The ``EvalResult``; ``reward`` is 1.0 exactly when ``resolved``.
    """

    async def steps(base: dict[str, Any], timings: dict[str, float]) -> EvalResult:
        backend_name = choose_backend(backend).name
        spec = instance_spec(instance, backend_name)
        if setups is None:
            async with open_sandbox(backend_name, spec, options=sandbox_options) as sb:
                t = time.monotonic()
                counts.set_up += 1
                await prepare_repo(sb, instance, backend_name)
                timings["setup"] = time.monotonic() - t
                return await _test_and_grade(
                    sb, instance, model_patch or "", base, timings, timeout, integrity_checks
                )
        raw = sandbox_options
        raw = raw.model_dump() if isinstance(raw, BaseModel) else dict(raw or {})
        options = get_backend(backend_name).Options.model_validate(raw)
        key = setup_key(instance.instance_id, backend_name, spec, options, "grading")

        async def prepare(sb: Sandbox) -> None:
            counts.set_up += 1
            await prepare_repo(sb, instance, backend_name)

        t = time.monotonic()
        sb = await setups.open(
            key, backend_name, spec, options, prepare, group_size=group_size, fork_first=True
        )
        timings["setup"] = time.monotonic() - t
        counts.forked += sb.origin is not None
        try:
            return await _test_and_grade(
                sb, instance, model_patch or "", base, timings, timeout, integrity_checks
            )
        finally:
            await sb.close()

    counts = SetupCounts()
    result = await _guarded(steps, instance, model_patch, model_name_or_path, test_empty)
    result.setup = counts
    return result


async def evaluate_in_sandbox(
    sb: Sandbox,
    instance: Instance,
    model_patch: str | None,
    *,
    model_name_or_path: str = "",
    timeout: float | None = None,
    integrity_checks: bool = True,
) -> EvalResult:
    """Grade the changes already in ``sb``'s repository (the agent's own sandbox).

    The model's changes stay as they are (``model_patch`` is recorded, not applied); the
    files ``test_patch`` touches are reset and ``test_patch`` applied, then the tests run as in
    :func:`evaluate`. Faster than a fresh sandbox, but whatever the agent left running or
    installed is still there: use :func:`evaluate` where that matters (training rewards).
    Never raises except on cancellation; the sandbox is not closed.

    Args:
        sb: a started sandbox whose ``instance.workdir`` holds the repository.
        instance: the task.
        model_patch: the diff of the agent's changes (``None``/empty gives ``empty_patch``).
        model_name_or_path: recorded in the result.
        timeout: seconds for the test command; defaults to ``instance.eval_timeout``.
        integrity_checks: as in :func:`evaluate`; the changes are then everything that differs
            from ``base_commit`` in the working tree.
    """

    async def steps(base: dict[str, Any], timings: dict[str, float]) -> EvalResult:
        return await _test_and_grade(sb, instance, None, base, timings, timeout, integrity_checks)

    return await _guarded(steps, instance, model_patch, model_name_or_path)


async def _guarded(
    steps: Callable[[dict[str, Any], dict[str, float]], Awaitable[EvalResult]],
    instance: Instance,
    model_patch: str | None,
    model_name_or_path: str,
    test_empty: bool = False,
) -> EvalResult:
    """``empty_patch`` for an empty ``model_patch`` (unless ``test_empty``); else run
    ``steps(base, timings)`` (the result's common fields; step durations in seconds, filled as
    they go), turning every failure but cancellation into an error ``EvalResult`` labelled with
    its :class:`EvalFailure`."""
    started = time.monotonic()
    base: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "model_name_or_path": model_name_or_path,
    }
    if (not model_patch or not model_patch.strip()) and not test_empty:
        return EvalResult(**base, status=EvalStatus.EMPTY_PATCH)
    timings: dict[str, float] = {}
    failure = EvalFailure.INFRASTRUCTURE
    try:
        result = await steps(base, timings)
    except _EvalError as exc:
        timings["total"] = time.monotonic() - started
        return EvalResult(
            **base, status=exc.status, error=str(exc), failure=exc.failure, timings_s=timings
        )
    except SandboxSetupError as exc:
        repository = repository_step(exc.step)
        failure = EvalFailure.REPOSITORY if repository else EvalFailure.ENVIRONMENT
        message = f"environment setup failed: {exc}"
    except EnvironmentBuildError as exc:
        failure, message = EvalFailure.ENVIRONMENT, f"environment build failed: {exc}"
    except SandboxError as exc:
        message = f"sandbox failure ({type(exc).__name__}): {exc}"
    except FileNotFoundError as exc:  # repo_source is not on this machine
        failure, message = EvalFailure.REPOSITORY, f"{type(exc).__name__}: {exc}"
    except ValueError as exc:  # what the instance lacks (a test command, an image)
        failure, message = EvalFailure.INSTANCE, f"{type(exc).__name__}: {exc}"
    except (OSError, LookupError) as exc:
        message = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # one instance must never take down the batch
        log.exception("evaluation of %s failed unexpectedly", instance.instance_id)
        message = f"unexpected {type(exc).__name__}: {exc}"
    else:
        # The result holds a copy of ``timings`` (pydantic validates the dict into its own).
        result.timings_s["total"] = time.monotonic() - started
        return result
    timings["total"] = time.monotonic() - started
    return EvalResult(
        **base, status=EvalStatus.ERROR, error=message, failure=failure, timings_s=timings
    )


async def _test_and_grade(
    sb: Sandbox,
    instance: Instance,
    model_patch: str | None,
    base: dict[str, Any],
    timings: dict[str, float],
    timeout: float | None,
    integrity_checks: bool,
) -> EvalResult:
    """Apply ``model_patch`` (``None``: already in place), list what the model changed from
    the repository, revert its test infrastructure, prepare the tests, run them (with the
    pytest channel), grade. An empty ``model_patch`` changes nothing. A patch into ``.git/``,
    outside the repository or through a symlink is refused (unresolved) before its tests
    run."""
    test_cmd = resolve_test_cmd(instance)
    parser = resolve_log_parser(instance)
    t = time.monotonic()
    git = TrustedGit(instance.workdir, instance.base_commit, scratch=EVAL_DIR)
    apply_cmd = None
    if model_patch is not None and not model_patch.strip():
        changes = Changes()
    elif model_patch is not None:
        refused = refused_names(model_patch)
        if refused:
            return _refused(base, refused, timings, applied=False)
        changes = await _apply_model_patch(sb, instance, model_patch, git, integrity_checks)
        apply_cmd = PATCH_APPLY_COMMANDS[changes.applied - 1] if changes.applied else None
    elif integrity_checks:
        changes = await _working_changes(sb, instance, git)
    else:
        changes = Changes()
    if changes.violations:
        return _refused(base, changes.violations, timings, applied=model_patch is not None)
    reverted: list[RevertedFile] = []
    if integrity_checks:
        try:
            reverted = await revert_test_infrastructure(sb, instance, changes, git)
        except RevertError as exc:
            raise _EvalError(EvalStatus.ERROR, str(exc), EvalFailure.INFRASTRUCTURE) from exc
    prepared = await _prepare_tests(
        sb, instance, git, then=hash_script(instance) if integrity_checks else ""
    )
    grader_hashes = parse_hashes(prepared)
    no_channel = channel_unavailable(test_cmd)
    channel = new_channel() if integrity_checks and no_channel is None else None
    timings["apply"] = time.monotonic() - t

    t = time.monotonic()
    limit = timeout if timeout is not None else instance.eval_timeout
    # 2>&1 inside the sandbox keeps the real interleaving of the test runner's output.
    run = await sb.exec(
        channel.command(test_cmd, instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
        if channel
        else f"exec 2>&1\n{test_cmd}",
        timeout=limit,
        cwd=instance.workdir,
        stdin=channel.stdin if channel else None,
    )
    timings["tests"] = time.monotonic() - t
    exit_code = None if run.timed_out else run.exit_code
    applied: dict[str, Any] = {
        "patch_applied": True,
        "patch_apply_command": apply_cmd,
        "reverted_files": reverted,
    }
    cannot_start = missing_runner(run.stdout, exit_code)
    if cannot_start is not None:
        return EvalResult(
            **base,
            **applied,
            status=EvalStatus.ERROR,
            error=cannot_start,
            failure=EvalFailure.ENVIRONMENT,
            tests_exit_code=run.exit_code,
            timings_s=timings,
            log=run.stdout + run.stderr,
        )
    graded = grade(instance, run.stdout, parser=parser, tests_exit_code=exit_code)
    integrity = Integrity(reverted_files=len(reverted))
    records = ""
    if integrity_checks:
        try:
            after, records = await _after_tests(sb, instance, channel)
        except GraderFilesError as exc:
            after = {"(grader files)": str(exc)}
        integrity.violations = changed_grader_files(grader_hashes, after)
    if channel is not None:
        verdict = judge_records(records, channel.key)
        reverted_paths = {r.path for r in reverted}
        kept = [p for p in changes.paths if p not in reverted_paths]
        checked = grade_channel(
            instance, verdict, parser=parser, log_statuses=graded.tests_status, model_files=kept
        )
        integrity.channel = ChannelState.VIOLATED if checked.violations else ChannelState.VERIFIED
        integrity.log_consistent = checked.log_consistent
        integrity.violations += checked.violations
        if verdict.exitstatus not in (None, exit_code) and exit_code is not None:
            graded.warnings.append(
                f"pytest ended with status {verdict.exitstatus} but the test command "
                f"exited {exit_code}"
            )
        graded = dataclasses.replace(
            checked.grade, tests_status=graded.tests_status, warnings=graded.warnings
        )
    elif integrity_checks and no_channel is not None:
        integrity.channel = ChannelState.UNAVAILABLE
        integrity.channel_note = no_channel
    else:
        integrity.channel = ChannelState.UNAVAILABLE
        integrity.channel_note = "integrity checks were turned off"
    graded.warnings += integrity.violations
    resolved = graded.resolved and not run.timed_out and not integrity.violations
    status = (
        EvalStatus.TIMED_OUT
        if run.timed_out
        else (EvalStatus.RESOLVED if resolved else EvalStatus.UNRESOLVED)
    )
    return EvalResult(
        **base,
        **applied,
        status=status,
        resolved=resolved,
        reward=1.0 if resolved else 0.0,
        tests_status=graded.tests_status,
        FAIL_TO_PASS=graded.fail_to_pass,
        PASS_TO_PASS=graded.pass_to_pass,
        tests_exit_code=exit_code,
        tests_timed_out=run.timed_out,
        log_warnings=graded.warnings,
        integrity=integrity,
        timings_s=timings,
        log=run.stdout + run.stderr,
    )


async def _after_tests(
    sb: Sandbox, instance: Instance, channel: ChannelRun | None
) -> tuple[dict[str, str], str]:
    """The grader files' hashes and the channel's records (``""`` without a channel or file),
    in one ``exec``; records too long for the output cap are read as a file.

    Raises:
        GraderFilesError: the hashing failed.
    """
    script = hash_script(instance)
    if channel is not None:
        script += f"cat -- {shlex.quote(channel.records_path)} 2>/dev/null || true\n"
    r = await sb.exec(script, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if not r.ok:
        raise GraderFilesError(
            f"hashing the grader's files failed (exit {r.exit_code}):\n"
            + output_tail(r.stdout + r.stderr)
        )
    records = r.stdout.partition(END_MARKER + "\n")[2]
    if channel is not None and r.truncated:
        try:
            records = (await sb.read_file(channel.records_path)).decode("utf-8", "replace")
        except SandboxFileError:
            records = ""
    return parse_hashes(r.stdout), records


async def _apply_model_patch(
    sb: Sandbox, instance: Instance, model_patch: str, git: TrustedGit, list_changes: bool
) -> Changes:
    """Apply the patch with the harness's fallbacks in one ``exec`` and, with
    ``list_changes``, list what it changed (:mod:`~sandlot.rewards.integrity.changes`)."""
    if not model_patch.endswith("\n"):
        model_patch += "\n"  # git apply rejects a diff whose last line lacks its newline
    await sb.write_file(MODEL_PATCH_PATH, model_patch)
    names = gnu_patch_paths(model_patch)
    names_path = None
    if sum(len(n) + 3 for n in names) > _INLINE_NAMES_MAX:  # a command line holds 128 KiB
        names_path = f"{MODEL_PATCH_PATH}.names"
        await sb.write_file(names_path, "".join(f"{n}\0" for n in names))
    script = git.script(
        apply_script(
            model_patch, PATCH_APPLY_COMMANDS, list_changes=list_changes, names_path=names_path
        )
    )
    r = await sb.exec(script, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    output = r.stdout
    if list_changes and r.ok and r.truncated:
        head = output.partition(LISTING_START)[0]
        output = head + await _read_listing(sb, git)
    changes = parse_apply_output(output, instance.workdir)
    if changes.violations:
        return changes
    if not r.ok or APPLIED not in r.stdout:
        raise _EvalError(
            EvalStatus.ERROR,
            f"applying the model patch failed (exit {r.exit_code}):\n"
            + output_tail(r.stdout + r.stderr),
            EvalFailure.INFRASTRUCTURE,
        )
    if not changes.applied:
        attempts = [
            f"$ {cmd}\n{output_tail(out, 10)}"
            for cmd, out in zip(PATCH_APPLY_COMMANDS, changes.attempts, strict=False)
        ]
        raise _EvalError(
            EvalStatus.PATCH_FAILED,
            "patch failed to apply with every fallback:\n" + "\n".join(attempts),
            EvalFailure.PATCH,
        )
    return changes


async def _working_changes(sb: Sandbox, instance: Instance, git: TrustedGit) -> Changes:
    """What differs from ``base_commit`` in the work tree (the agent's own sandbox)."""
    r = await sb.exec(
        git.script("set -e\n" + working_changes_script()),
        timeout=_STEP_TIMEOUT_S,
        cwd=instance.workdir,
    )
    if not r.ok:
        raise _EvalError(
            EvalStatus.ERROR,
            f"cannot list the model's changes:\n{output_tail(r.stdout + r.stderr)}",
            EvalFailure.INFRASTRUCTURE,
        )
    output = await _read_listing(sb, git) if r.truncated else r.stdout
    return parse_working_changes(output)


async def _read_listing(sb: Sandbox, git: TrustedGit) -> str:
    """The listing file of the changes, when it did not fit in the output cap."""
    try:
        data = await sb.read_file(f"{git.git_dir}/{LISTING}")
    except SandboxFileError as exc:
        raise _EvalError(
            EvalStatus.ERROR,
            f"cannot read the list of the model's changes: {exc}",
            EvalFailure.INFRASTRUCTURE,
        ) from exc
    return data.decode("utf-8", "surrogateescape")


def _refused(
    base: dict[str, Any], reasons: list[str], timings: dict[str, float], *, applied: bool
) -> EvalResult:
    """The unresolved result of a patch refused before its tests ran."""
    return EvalResult(
        **base,
        status=EvalStatus.UNRESOLVED,
        patch_applied=applied,
        log_warnings=list(reasons),
        integrity=Integrity(violations=list(reasons)),
        timings_s=timings,
    )


async def _prepare_tests(
    sb: Sandbox, instance: Instance, git: TrustedGit, *, then: str = ""
) -> str:
    """Reset the files ``test_patch`` touches to ``base_commit``, then apply ``test_patch``;
    then run the shell ``then`` in the same ``exec`` (saves a round trip). Returns the output.

    An empty ``test_patch`` means the graded tests come with the environment (R2E-Gym keeps
    them in its images): there is nothing to reset or apply.
    """
    if not instance.test_patch.strip():
        if not then:
            return ""
        script = f"set -e\n{then}"
    else:
        files = patch_files(instance.test_patch)
        test_patch = (
            instance.test_patch
            if instance.test_patch.endswith("\n")
            else instance.test_patch + "\n"
        )
        await sb.write_file(TEST_PATCH_PATH, test_patch)
        reset = reset_test_files_script(instance.base_commit, files)
        script = git.script(f"set -e\n{reset}{apply_test_patch_script()}\n{then}")
    r = await sb.exec(script, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if not r.ok:
        raise _EvalError(
            EvalStatus.ERROR,
            "test_patch failed to apply after resetting the test files (check the "
            f"instance's base_commit and test_patch):\n{output_tail(r.stdout + r.stderr)}",
            EvalFailure.TEST_PATCH,
        )
    return r.stdout
