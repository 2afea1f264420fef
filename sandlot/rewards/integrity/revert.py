"""Undo the model's changes to test infrastructure in the sandbox (rules in ``policy``)."""

from __future__ import annotations

import shlex

from sandlot.datasets.instance import Instance
from sandlot.rewards.integrity.policy import (
    RevertedFile,
    RevertPolicy,
    is_sectioned,
    path_reason,
    runner_sections_changed,
    select,
)
from sandlot.rewards.scripts import patch_files, reset_test_files_script
from sandlot.sandboxes.base import Sandbox, output_tail

_STEP_TIMEOUT_S = 600.0
_GIT = "git -c core.quotepath=off"


class RevertError(Exception):
    """The revert commands failed (the message carries their output)."""


async def revert_test_infrastructure(
    sb: Sandbox, instance: Instance, model_patch: str | None
) -> list[RevertedFile]:
    """Find the model's changes to test infrastructure in ``instance.workdir`` and undo them.

    Args:
        sb: the sandbox holding the repository with the model's changes applied.
        instance: supplies ``base_commit``, ``test_patch`` and the ``integrity_allow`` policy.
        model_patch: the applied patch; its files are the changes. ``None``: the changes are
            whatever differs from ``base_commit`` in the working tree (tracked or not, outside
            ``site-packages``), as in :func:`~sandlot.rewards.evaluate.evaluate_in_sandbox`.

    Returns:
        The reverted files with their reasons, in path order.

    Raises:
        RevertError: git could not list or restore the files.
    """
    policy = RevertPolicy.for_instance(instance)
    test_files = patch_files(instance.test_patch)
    if model_patch is not None:
        paths = patch_files(model_patch)
    else:
        paths = await _working_changes(sb, instance)
    # Only paths some rule could revert need a look at base_commit (a rule never widens for
    # a path that exists there).
    paths = [
        p
        for p in paths
        if p in test_files or is_sectioned(p) or path_reason(p, added=True) is not None
    ]
    if not paths:
        return []
    at_base = await _paths_at_base(sb, instance, paths)
    changed = [(p, p not in at_base) for p in paths]
    reverted = select(changed, policy, test_files)
    for path, added in changed:
        if is_sectioned(path) and path not in test_files and not policy.allows(path):
            before = (
                None if added else await _text(sb, instance, f"git show {_rev(instance, path)}")
            )
            after = await _text(sb, instance, f"cat -- {shlex.quote(path)}")
            reason = runner_sections_changed(path, before, after)
            if reason:
                reverted.append(RevertedFile(path=path, reason=reason))
    reverted.sort(key=lambda r: r.path)
    if reverted:
        script = "set -e\n" + reset_test_files_script(
            instance.base_commit, [r.path for r in reverted]
        )
        r = await sb.exec(script, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
        if not r.ok:
            raise RevertError(
                "reverting the model's changes to test infrastructure failed:\n"
                + output_tail(r.stdout + r.stderr)
            )
    return reverted


def _rev(instance: Instance, path: str) -> str:
    return shlex.quote(f"{instance.base_commit}:{path}")


async def _text(sb: Sandbox, instance: Instance, cmd: str) -> str | None:
    r = await sb.exec(cmd, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    return r.stdout if r.ok else None


async def _paths_at_base(sb: Sandbox, instance: Instance, paths: list[str]) -> set[str]:
    quoted = " ".join(shlex.quote(p) for p in paths)
    cmd = (
        f"{_GIT} --literal-pathspecs ls-tree -r -z --name-only "
        f"{shlex.quote(instance.base_commit)} -- {quoted}"
    )
    r = await sb.exec(cmd, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if not r.ok:
        raise RevertError(
            f"cannot list the files at base_commit:\n{output_tail(r.stdout + r.stderr)}"
        )
    return {p for p in r.stdout.split("\0") if p}


async def _working_changes(sb: Sandbox, instance: Instance) -> list[str]:
    cmd = (
        f"set -e\n{_GIT} diff --no-renames --name-only -z {shlex.quote(instance.base_commit)}\n"
        f"{_GIT} ls-files -z --others\n"
    )
    r = await sb.exec(cmd, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if not r.ok:
        raise RevertError(f"cannot list the model's changes:\n{output_tail(r.stdout + r.stderr)}")
    seen = dict.fromkeys(p for p in r.stdout.split("\0") if p)
    # An environment installed inside the repository (R2E-Gym's .venv) is not the model's patch.
    return [p for p in seen if "site-packages/" not in p]
