"""``submit`` and ``finish``: the calls that end an episode.

``submit`` returns the model patch: the sandbox repository's work tree against ``base_commit``
as ``git diff`` prints it, new untracked files included (files ignored by ``.gitignore`` or
``.git/info/exclude`` excluded), binary files left out (a ``Binary files differ`` hunk does not
apply; a file is binary by its bytes). The diff is computed by
:class:`~sandlot.tools.trusted_git.TrustedGit`, the evaluator's git: its own git directory and
index (built from ``base_commit``, the repository's objects borrowed read-only) and no
configuration, hooks or attributes of the repository's. So nothing the agent may have set there
runs or changes the patch: hooks and ``core.hooksPath``, ``core.fsmonitor``, ``include.path``,
clean filters from ``.gitattributes``, ``.git/info/attributes`` or ``core.attributesFile``, a
``textconv`` driver or an external diff, color and prefixes, and ``assume-unchanged`` or
``skip-worktree`` bits in its index; the files are compared byte for byte, as the evaluator's
git applies the patch. The agent's index and object store are not touched.
"""

from __future__ import annotations

import re
import shlex
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from sandlot.sandboxes.base import Sandbox, output_tail
from sandlot.tools.base import Tool
from sandlot.tools.tool_result import ToolError, ToolResult
from sandlot.tools.trusted_git import TrustedGit

# The private git directory of one submission goes under it (and is removed after).
_SCRATCH = "/tmp"
_FULL_HASH = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

# Under the trusted git, whose index is base_commit: stage the work tree, then print the patch
# without the binary files. .git/info/exclude is only patterns (read, never run).
_DIFF_SCRIPT = """set -e
if [ -f "$GIT_WORK_TREE/.git/info/exclude" ]; then
  cat -- "$GIT_WORK_TREE/.git/info/exclude" > "$SANDLOT_GIT_DIR/info/exclude"
fi
git add -A .
excludes=()
while IFS=$'\\t' read -r -d '' added deleted path; do
  if [ "$added" = - ]; then excludes+=(":(top,exclude,literal)$path"); fi
done < <(git diff --cached --no-renames --numstat -z HEAD)
git diff --cached --no-renames --no-ext-diff --no-textconv --no-color \\
  --src-prefix=a/ --dst-prefix=b/ HEAD -- . "${excludes[@]}"
"""

# The commit a revision names in the repository (base_commit given as a branch, a short hash
# or HEAD): rev-parse reads refs and objects only, under the trusted git's environment and
# overrides, with the repository's own git directory.
_RESOLVE_SCRIPT = 'git --git-dir="$GIT_WORK_TREE/.git" rev-parse --verify "$1^{commit}"\n'


class SubmitArgs(BaseModel):
    """``submit`` takes no arguments."""

    model_config = ConfigDict(extra="forbid")


class SubmitTool(Tool):
    """Ends the episode; the repository's diff against ``base_commit`` is the model patch."""

    name: ClassVar[str] = "submit"
    description: ClassVar[str] = (
        "Submit your changes once the task is solved. The diff of the repository against its "
        "original commit becomes your solution, and the episode ends."
    )
    Args: ClassVar[type[BaseModel]] = SubmitArgs

    async def run(self, args: SubmitArgs) -> ToolResult:
        patch = await diff_against_base(
            self.context.sandbox, self.context.repo, self.context.base_commit
        )
        return ToolResult(output=patch or "No changes to submit.", done=True, patch=patch)


async def diff_against_base(sandbox: Sandbox, repo: str, base_commit: str | None) -> str:
    """The patch of ``repo``'s working tree against ``base_commit`` (``HEAD`` when ``None``).

    Raises:
        ToolError: ``repo`` is not a git repository or the base commit is unknown.
    """
    repo = sandbox.resolve_path(repo)
    base = await _commit(sandbox, repo, base_commit or "HEAD")
    git = TrustedGit(repo, base, scratch=_SCRATCH)
    cleanup = f"trap 'rm -rf -- {shlex.quote(git.git_dir)}' EXIT\n"
    script = cleanup + git.script(_DIFF_SCRIPT)
    r = await sandbox.exec(f"bash -c {shlex.quote(script)}", cwd=repo, timeout=600)
    if not r.ok:
        raise ToolError(
            f"Could not compute the diff of {repo} against {base}: {output_tail(r.stderr)}"
        )
    return r.stdout


async def _commit(sandbox: Sandbox, repo: str, rev: str) -> str:
    """The full hash of the commit ``rev`` names in ``repo`` (a full hash is taken as is)."""
    if _FULL_HASH.fullmatch(rev):
        return rev
    # A TrustedGit's preamble only (no private directory is made): its environment and -c
    # overrides, with the repository's git directory given on the command line.
    script = TrustedGit(repo, rev, scratch=_SCRATCH).preamble() + _RESOLVE_SCRIPT
    r = await sandbox.exec(
        f"bash -c {shlex.quote(script)} resolve {shlex.quote(rev)}", cwd=repo, timeout=60
    )
    commit = r.stdout.strip()
    if not r.ok or not _FULL_HASH.fullmatch(commit):
        raise ToolError(f"Could not find the commit {rev} in {repo}: {output_tail(r.stderr)}")
    return commit


class FinishArgs(BaseModel):
    """Arguments of ``finish``."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(default="", description="Your final answer or a summary of what you did.")


class FinishTool(Tool):
    """Ends the episode with a message (for tasks without a patch)."""

    name: ClassVar[str] = "finish"
    description: ClassVar[str] = "Finish the task, with your final answer or a short summary."
    Args: ClassVar[type[BaseModel]] = FinishArgs

    async def run(self, args: FinishArgs) -> ToolResult:
        return ToolResult(output=args.message or "Finished.", done=True)
