"""Hide the repository's future from the agent: the git history script, and its run in a sandbox.

A clone of a live repository, or a dataset's image (SWE-rebench, SWE-bench before its fix of
issue #465 "Repo State Loopholes During Agentic Evaluation"), holds the commits that came after
``base_commit`` — the fix among them — in tags, other branches, remote-tracking refs, notes, the
stash, reflogs, ``FETCH_HEAD``/``ORIG_HEAD``, linked worktrees, alternates and unreachable
objects. An agent that runs ``git log --all --grep '#<PR>'`` or ``git show <tag>`` reads the
answer (uni-agent's commit #23, "future tags and reflog revealed the gold patch"; mini-swe-agent
issue #787 saw frontier models do it on 11-21 % of SWE-bench Pro tasks), and a model patch can
``git show`` the fix at import time while the tests run. :func:`strip_future_history_cmd`
returns a bash script, run in the repository, that keeps exactly ``HEAD`` and its ancestors:

1. leaves a directory that is not a git repository alone; checks that ``base_commit`` is
   ``HEAD`` or an ancestor of it (SWE-bench style images commit their environment setup on top
   of ``base_commit``; that commit is kept), exit 1 otherwise;
2. removes every remote and every linked worktree (its files too);
3. deletes every ref except the branch ``HEAD`` is on and tags that point into ``HEAD``'s
   history (other branches, later tags, stash, notes, replace refs, remote-tracking refs);
4. deletes ``FETCH_HEAD``, ``ORIG_HEAD`` and the other ``*_HEAD`` files that name commits, the
   commit-graph and the rerere cache;
5. expires every reflog, drops alternates (after copying the objects it borrows) and runs
   ``git gc --prune=now``, which deletes the now unreachable objects;
6. verifies that no ref reaches a commit outside ``HEAD``'s history (exit 1 otherwise).

:func:`hide_future` runs it in every sandbox once its repository is set up
(:func:`sandlot.datasets.sandbox_setup.prepare_repo`, for the agent's sandbox and the
evaluation's alike), so no dataset row carries it in its ``post_setup_cmd``. Cost: one
``git gc`` of the history: about 2 s for a 3,000-commit repository on 2 cores. A copy of the
repository elsewhere in an image (an alternate's own directory, a mirror) is the dataset's to
remove.

SWE-bench's own images run a weaker variant when they are built (tags newer than the base
commit's date, reflog, ``gc``; ``swebench.harness.test_spec.python.make_repo_script_list_py``);
uni-agent runs ``git tag -d $(git tag -l) && git reflog expire --expire=now --all && git gc
--prune=now`` (``examples/data_preprocess/swe_rebench.py``), which leaves other branches.
"""

from __future__ import annotations

import logging
import shlex

from sandlot.datasets.instance import Instance
from sandlot.errors import SandboxSetupError
from sandlot.sandboxes.base import Sandbox, output_tail

log = logging.getLogger(__name__)

_SCRIPT = """\
set -euo pipefail
export GIT_TERMINAL_PROMPT=0
git config --global --add safe.directory '*' 2>/dev/null || true
git_dir=$(git rev-parse --absolute-git-dir 2>/dev/null) || {{ echo "no repository"; exit 0; }}
git() {{ command git -c core.hooksPath=/dev/null -c core.fsmonitor=false "$@"; }}
if ! git merge-base --is-ancestor {base} HEAD; then
  echo "sandlot: base_commit {base} is not HEAD or an ancestor of it" >&2
  exit 1
fi
for remote in $(git remote); do git remote remove "$remote"; done
git worktree list --porcelain | sed -n 's/^worktree //p' | tail -n +2 | while IFS= read -r w; do
  git worktree remove --force --force "$w" || rm -rf -- "$w"
done
branch=$(git symbolic-ref -q HEAD || true)
git for-each-ref --format='%(refname)' | while IFS= read -r ref; do
  if [ "$ref" = "$branch" ]; then continue; fi
  case "$ref" in
    refs/tags/*) if git merge-base --is-ancestor "$ref" HEAD 2>/dev/null; then continue; fi ;;
  esac
  git update-ref -d "$ref"
done
rm -f "$git_dir"/FETCH_HEAD "$git_dir"/ORIG_HEAD "$git_dir"/MERGE_HEAD \\
  "$git_dir"/CHERRY_PICK_HEAD "$git_dir"/REVERT_HEAD "$git_dir"/BISECT_LOG \\
  "$git_dir"/AUTO_MERGE "$git_dir"/objects/info/commit-graph
rm -rf "$git_dir"/objects/info/commit-graphs "$git_dir"/rr-cache "$git_dir"/refs/original
git worktree prune
git reflog expire --expire=now --expire-unreachable=now --all
if [ -s "$git_dir/objects/info/alternates" ]; then
  git repack -a -d -q
  rm -f "$git_dir/objects/info/alternates"
fi
git gc --prune=now --quiet
leaked=$(git rev-list --all --not HEAD | head -n 5)
if [ -n "$leaked" ]; then
  echo "sandlot: commits outside HEAD's history are still reachable: $leaked" >&2
  exit 1
fi
"""


def strip_future_history_cmd(base_commit: str) -> str:
    """The bash script described in the module docstring, for a repository at ``base_commit``.

    Run it with the repository as the working directory (``post_setup_cmd`` runs in
    ``workdir``). It exits non-zero when ``base_commit`` is not in ``HEAD``'s history or when
    a commit outside that history stays reachable.
    """
    if not base_commit.strip():
        raise ValueError("base_commit is empty")
    return _SCRIPT.format(base=shlex.quote(base_commit))


HIDE_STEP = "remove the repository's history after base_commit"
"""The ``step`` of the :class:`SandboxSetupError` :func:`hide_future` raises."""


async def hide_future(sb: Sandbox, instance: Instance) -> None:
    """Leave only ``HEAD``'s history in ``instance.workdir``'s repository
    (:func:`strip_future_history_cmd`); a work directory that is not a git repository is left
    as it is.

    Raises:
        SandboxSetupError: ``base_commit`` is not ``HEAD`` or an ancestor of it, or a git step
            failed (carries the output tail).
    """
    script = strip_future_history_cmd(instance.base_commit)
    r = await sb.exec(["bash", "-c", script], cwd=instance.workdir, timeout=1800)
    if not r.ok:
        raise SandboxSetupError(
            "sandlot.datasets.git_history.strip_future_history_cmd",
            r.exit_code,
            output_tail(r.stdout + r.stderr),
            step=HIDE_STEP,
        )
    log.debug("%s: history after base_commit removed", instance.instance_id)
