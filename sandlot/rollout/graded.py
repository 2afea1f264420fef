"""Nothing graded in the agent's sandbox: the instance's graded artefacts go before the first turn.

Some environments hold what grades an instance: R2E-Gym's images carry the hidden tests
(``/r2e_tests``) and their runner (``run_tests.sh``), and R2E-Gym itself links them into the
repository. The agent is root in its sandbox, so whatever the set-up leaves there it can read,
copy into its patch or learn to look for. An episode's set-up therefore deletes every path of
:meth:`~sandlot.datasets.instance.Instance.graded_artefacts` (the converter's
``graded_paths``, and the files ``test_patch`` creates) and every symlink of the repository
that points into one, right after :func:`~sandlot.datasets.sandbox_setup.prepare_repo`, for
rollouts and training alike. The evaluation's fresh sandbox runs ``prepare_repo`` alone and
gets them from its image.

With reward mode ``same`` the tests run in the agent's sandbox: the artefacts are first copied
to the host (:class:`GradedFiles`), deleted for the episode and put back, replacing whatever
the agent left at their paths, only for the grading. A path that cannot be deleted (a read-only
image directory) is reported, loudly: the agent could have read it.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from sandlot.datasets.instance import Instance
from sandlot.errors import SandboxSetupError
from sandlot.sandboxes.base import Sandbox, output_tail

log = logging.getLogger("sandlot.rollout")

_TIMEOUT_S = 600.0
_PRESENT = "sandlot-graded-present:"
_LEFT = "sandlot-graded-left:"

# $1 = the workdir, then the graded paths. Lists the paths present (before), deletes the
# repository's symlinks that resolve into one of them, deletes them, lists what is left.
_REMOVE_SCRIPT = r"""
ws=$1; shift
resolved=()
for p in "$@"; do
  if [ -e "$p" ] || [ -L "$p" ]; then printf '%s%s\n' "$PRESENT" "$p"; fi
  r=$(readlink -f -- "$p" 2>/dev/null) && resolved+=("$r")
done
if [ -d "$ws" ]; then
  find "$ws" -path "$ws/.git" -prune -o -type l -print0 2>/dev/null |
  while IFS= read -r -d '' link; do
    target=$(readlink -f -- "$link" 2>/dev/null) || continue
    for r in "$@" "${resolved[@]}"; do
      case "$target/" in "$r"/*) rm -f -- "$link"; break ;; esac
    done
  done
fi
for p in "$@"; do rm -rf -- "$p" 2>/dev/null; done
for p in "$@"; do
  if [ -e "$p" ] || [ -L "$p" ]; then printf '%s%s\n' "$LEFT" "$p"; fi
done
exit 0
"""


@dataclass
class GradedFiles:
    """What :func:`remove_graded` did in one sandbox.

    Attributes:
        removed: graded paths that existed and were deleted.
        left: graded paths that could not be deleted (the agent can read them).
        copies: for reward mode ``same``, the host copy of each path that existed, to put
            back before the grading (:func:`restore_graded`).
    """

    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    copies: dict[str, Path] = field(default_factory=dict)

    def leak_warning(self, instance: Instance) -> str | None:
        """The warning to record when some graded path survived, else ``None``."""
        if not self.left:
            return None
        return (
            f"{instance.instance_id}: graded files the agent could read stayed in its sandbox "
            f"(they could not be deleted): {', '.join(self.left)}; a reward of this episode may "
            "come from reading them"
        )


async def remove_graded(
    sb: Sandbox, instance: Instance, *, copy_to: Path | None = None
) -> GradedFiles:
    """Delete ``instance``'s graded artefacts (and the repository's symlinks into them) from
    ``sb``; with ``copy_to`` (a host directory), copy each one there first.

    Raises:
        SandboxSetupError: the script could not run.
        SandboxError: the sandbox failed (a copy too large is a ``DownloadLimitError``).
    """
    paths = instance.graded_artefacts()
    done = GradedFiles()
    if not paths:
        return done
    if copy_to is not None:
        for i, path in enumerate(await _present(sb, paths)):
            local = copy_to / str(i)
            await sb.download(path, local)
            done.copies[path] = local
    script = f"PRESENT={_PRESENT}\nLEFT={_LEFT}\n{_REMOVE_SCRIPT}"
    r = await sb.exec(
        f"bash -c {shlex.quote(script)} graded {shlex.join([instance.workdir, *paths])}",
        timeout=_TIMEOUT_S,
        cwd="/",
    )
    if not r.ok:
        raise SandboxSetupError(
            "(delete the graded files)",
            r.exit_code,
            output_tail(r.stdout + r.stderr),
            step="remove graded files",
        )
    lines = r.stdout.splitlines()
    present = [line.removeprefix(_PRESENT) for line in lines if line.startswith(_PRESENT)]
    done.left = [line.removeprefix(_LEFT) for line in lines if line.startswith(_LEFT)]
    done.removed = [p for p in present if p not in done.left]
    return done


async def restore_graded(sb: Sandbox, graded: GradedFiles) -> None:
    """Put the host copies of :func:`remove_graded` back at their paths, replacing whatever is
    there now (the agent may have planted its own ``run_tests.sh``).

    Raises:
        SandboxSetupError: a path could not be cleared.
        SandboxError: the sandbox failed.
    """
    if not graded.copies:
        return
    clear = "\n".join(
        f"rm -rf -- {shlex.quote(p)} && mkdir -p -- {shlex.quote(p.rsplit('/', 1)[0] or '/')}"
        for p in graded.copies
    )
    r = await sb.exec(f"set -e\n{clear}", timeout=_TIMEOUT_S, cwd="/")
    if not r.ok:
        raise SandboxSetupError(
            clear, r.exit_code, output_tail(r.stdout + r.stderr), step="restore graded files"
        )
    for path, local in graded.copies.items():
        await sb.upload(local, path)


async def _present(sb: Sandbox, paths: list[str]) -> list[str]:
    """The paths of ``paths`` that exist in ``sb`` (a symlink counts by its target)."""
    tests = "\n".join(
        f"if [ -e {shlex.quote(p)} ]; then printf '%s\\n' {shlex.quote(_PRESENT + p)}; fi"
        for p in paths
    )
    r = await sb.exec(tests, timeout=_TIMEOUT_S, cwd="/")
    lines = r.stdout.splitlines()
    return [line.removeprefix(_PRESENT) for line in lines if line.startswith(_PRESENT)]
