"""No future of the repository in a sandbox: only ``HEAD`` and its history stay.

A repository cloned for an episode, or baked into a dataset's image, usually holds more than
its ``base_commit``: other branches, tags, remote-tracking refs, reflogs and unreachable objects
left by the ``git reset --hard`` that put it at ``base_commit``. Among them is often the
upstream commit that fixed the instance's issue, whose diff is the reference ``patch``; an
agent finds it with ``git log --all --grep '#<PR>'`` and ``git show`` (SWE-bench issue #465,
"Repo State Loopholes During Agentic Evaluation"; mini-swe-agent issue #787 saw frontier
models do it on 11-21 % of SWE-bench Pro tasks); a model patch can do the same while the tests
run (``git show <fix>:module.py``, executed at import). So once the repository is set up
(:func:`sandlot.rewards.instance_setup.prepare_repo`, for the agent's sandbox and the
evaluation's alike) :func:`hide_future`
keeps ``HEAD`` (and the branch it names; ``base_commit`` under ``refs/sandlot/base_commit`` where
it is not an ancestor of ``HEAD``) and deletes every other ref (branches, tags, remotes
and their config, notes, stash, ``refs/replace``), the reflogs, the ``*_HEAD`` files, linked
worktrees (with their files), the commit-graph and the rerere cache, then repacks only what
``HEAD`` and the index reach (``git repack -a -d``: objects borrowed from an alternate are
copied in and the alternate dropped) and prunes every loose object left
(``git prune --expire=now``). What an agent can reach with git afterwards is the history up
to ``HEAD``, as a developer at that commit would have it. Not covered: a copy of the
repository elsewhere in the image (an alternate's own directory, a mirror): the dataset's image
must not ship one.

Cost: one repack of the history: 2.2 s for verl's 2,900 commits on 2 cores, more for larger
histories.
"""

from __future__ import annotations

import logging

from sandlot.datasets.instance import Instance
from sandlot.errors import SandboxSetupError
from sandlot.sandboxes.base import Sandbox, output_tail

log = logging.getLogger(__name__)

# The dataset's own .git config is trusted (the agent has not run yet), hooks are not needed.
_SCRIPT = r"""set -e
git() { command git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c gc.auto=0 \
  -c maintenance.auto=false "$@"; }
gd=$(git rev-parse --absolute-git-dir 2>/dev/null) || { echo "no repository"; exit 0; }
head=$(git symbolic-ref -q HEAD || true)
for r in $(git remote); do git remote remove "$r"; done
git worktree list --porcelain | sed -n 's/^worktree //p' | tail -n +2 | while IFS= read -r w; do
  git worktree remove --force --force "$w" || rm -rf -- "$w"
done
git for-each-ref --format='%(refname)' | while IFS= read -r ref; do
  [ "$ref" = "$head" ] || git update-ref -d "$ref"
done
# The evaluator diffs and resets against base_commit ($1): kept even where HEAD moved past it.
if base=$(git rev-parse -q --verify "$1^{commit}") && ! git merge-base --is-ancestor "$base" HEAD
then git update-ref refs/sandlot/base_commit "$base"; fi
rm -rf -- "$gd/logs" "$gd/worktrees" "$gd/rr-cache" "$gd/objects/info/commit-graph" \
  "$gd/objects/info/commit-graphs" "$gd/refs/original"
for f in ORIG_HEAD FETCH_HEAD MERGE_HEAD CHERRY_PICK_HEAD REVERT_HEAD AUTO_MERGE BISECT_LOG; do
  rm -f -- "$gd/$f"
done
git repack -a -d -q
rm -f -- "$gd/objects/info/alternates"
git prune --expire=now
echo "history kept up to $(git rev-parse --short HEAD)"
"""


async def hide_future(sb: Sandbox, instance: Instance) -> None:
    """Leave only ``HEAD``'s history in ``instance.workdir``'s repository (see the module
    docstring); a work directory that is not a git repository is left as it is.

    Raises:
        SandboxSetupError: a git step failed (carries the output tail).
    """
    argv = ["bash", "-c", _SCRIPT, "hide-future", instance.base_commit]
    r = await sb.exec(argv, cwd=instance.workdir, timeout=1800)
    if not r.ok:
        raise SandboxSetupError(
            "git: keep HEAD's history only (sandlot.rollout.history)",
            r.exit_code,
            output_tail(r.stdout + r.stderr),
            step="hide the repository's future commits",
        )
    log.debug("%s: %s", instance.instance_id, r.stdout.strip())
