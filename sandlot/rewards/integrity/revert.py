"""Undo the model's changes to test infrastructure in the sandbox (rules in ``policy``)."""

from __future__ import annotations

import base64
import shlex

from sandlot.datasets.instance import Instance
from sandlot.errors import SandlotError
from sandlot.rewards.integrity.changes import Changes
from sandlot.rewards.integrity.policy import (
    RevertedFile,
    RevertPolicy,
    is_sectioned,
    path_reason,
    runner_sections_changed,
    runner_sections_reason,
    select,
)
from sandlot.rewards.scripts import patch_files, reset_test_files_script
from sandlot.sandboxes.base import Sandbox, output_tail
from sandlot.tools.trusted_git import TrustedGit

_STEP_TIMEOUT_S = 600.0


class RevertError(SandlotError):
    """The revert commands failed (the message carries their output)."""


async def revert_test_infrastructure(
    sb: Sandbox,
    instance: Instance,
    changes: Changes,
    git: TrustedGit,
) -> list[RevertedFile]:
    """Undo the model's changes to test infrastructure in ``instance.workdir``.

    Args:
        sb: the sandbox holding the repository with the model's changes applied.
        instance: supplies ``base_commit``, ``test_patch`` and the ``integrity_allow`` policy.
        changes: what the model changed, as the repository lists it
            (:mod:`~sandlot.rewards.integrity.changes`); a symlink or new directory is judged
            as the directory it stands for too (``tests -> elsewhere`` is test code).
        git: the evaluator's git for this evaluation.

    Returns:
        The reverted files with their reasons, in path order.

    Raises:
        RevertError: git could not list or restore the files.
    """
    policy = RevertPolicy.for_instance(instance)
    test_files = patch_files(instance.test_patch)
    # Only paths some rule could revert need a look at base_commit (a rule never widens for
    # a path that exists there).
    paths = [
        p
        for p in changes.paths
        if p in test_files
        or is_sectioned(p)
        or path_reason(p, added=True) is not None
        or (p in changes.dir_like and _as_directory(p, test_files) is not None)
    ]
    if not paths:
        return []
    at_base = await _paths_at_base(sb, instance, paths, git)
    changed = [(p, p not in at_base) for p in paths]
    reverted = select(changed, policy, test_files)
    listed = {r.path for r in reverted}
    for path, _ in changed:
        if path in changes.dir_like and path not in listed:
            reason = _as_directory(path, test_files)
            if reason and (reason == _IN_THE_WAY or not policy.allows(path)):
                reverted.append(RevertedFile(path=path, reason=reason))
    for path, added in changed:
        if is_sectioned(path) and path not in test_files and not policy.allows(path):
            try:
                show = f"set -o pipefail\ngit show {_rev(instance, path)} | base64\n"
                before = None if added else await _bytes(sb, instance, git.script(show))
                q = shlex.quote(path)
                after = await _bytes(sb, instance, f"[ -e {q} ] || exit {_ABSENT}\nbase64 < {q}")
                reason = runner_sections_changed(path, before, after)
            except _Unreadable as exc:
                reason = runner_sections_reason(path, str(exc))
            if reason:
                reverted.append(RevertedFile(path=path, reason=reason))
    reverted.sort(key=lambda r: r.path)
    if reverted:
        script = git.script(
            "set -e\n" + reset_test_files_script(instance.base_commit, [r.path for r in reverted])
        )
        r = await sb.exec(script, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
        if not r.ok:
            raise RevertError(
                "reverting the model's changes to test infrastructure failed:\n"
                + output_tail(r.stdout + r.stderr)
            )
    return reverted


_IN_THE_WAY = "symlink or directory in the way of the instance's test_patch files"


def _as_directory(path: str, test_files: list[str]) -> str | None:
    """Why ``path``, a symlink or new directory, is reverted as the directory it stands for:
    a test directory (``tests -> elsewhere``) or a leading path of a ``test_patch`` file."""
    if any(f.startswith(path + "/") for f in test_files):
        return _IN_THE_WAY
    reason = path_reason(f"{path}/__init__.py", added=True)
    return f"{reason} (as a directory)" if reason else None


def _rev(instance: Instance, path: str) -> str:
    return shlex.quote(f"{instance.base_commit}:{path}")


_ABSENT = 3  # the exit status of a file read whose file does not exist


class _Unreadable(Exception):
    """A file could not be read in full (the message says why)."""


async def _bytes(sb: Sandbox, instance: Instance, cmd: str) -> bytes | None:
    """The exact bytes ``cmd`` prints in base64; ``None`` when it exits :data:`_ABSENT`.

    Raises:
        _Unreadable: ``cmd`` failed, or its output went past the sandbox's cap (a file of
            about 3/4 of it): what the check cannot read counts as changed.
    """
    r = await sb.exec(cmd, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if r.exit_code == _ABSENT and not r.timed_out:
        return None
    if not r.ok:
        raise _Unreadable(f"cannot be read: {output_tail(r.stderr or r.stdout, lines=1)}")
    if r.truncated:
        raise _Unreadable("too large to read")
    return base64.b64decode(r.stdout)


async def _paths_at_base(
    sb: Sandbox, instance: Instance, paths: list[str], git: TrustedGit
) -> set[str]:
    quoted = " ".join(shlex.quote(p) for p in paths)
    cmd = git.script(
        f"git --literal-pathspecs ls-tree -r -z --name-only "
        f"{shlex.quote(instance.base_commit)} -- {quoted}\n"
    )
    r = await sb.exec(cmd, timeout=_STEP_TIMEOUT_S, cwd=instance.workdir)
    if not r.ok:
        raise RevertError(
            f"cannot list the files at base_commit:\n{output_tail(r.stdout + r.stderr)}"
        )
    out = {p for p in r.stdout.split("\0") if p}
    # A directory at base_commit counts as there (a symlink replacing it is restored).
    return out | {p for p in paths if any(f.startswith(p + "/") for f in out)}
