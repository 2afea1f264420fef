"""``submit`` and ``finish``: the calls that end an episode.

``submit`` returns the model patch: the sandbox repository's changes against ``base_commit``
as ``git diff`` prints them, new untracked files included (files ignored by ``.gitignore``
excluded), binary files left out (a ``Binary files differ`` hunk does not apply). It stages
into a temporary copy of the index (``GIT_INDEX_FILE``), so the agent's own index is untouched.
The repository's own diff settings (a ``textconv`` driver, an external diff, color, prefixes),
which the agent may have set, are overridden: the patch is what ``git apply`` takes.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from sandlot.sandboxes.base import Sandbox
from sandlot.tools.base import Tool
from sandlot.tools.tool_result import ToolError, ToolResult

_GIT = (
    "git -c core.pager=cat -c color.ui=false -c core.quotepath=false "
    "-c diff.noprefix=false -c diff.mnemonicPrefix=false"
)

# $1 = base revision. Prints the patch; exits non-zero with git's message on failure.
_DIFF_SCRIPT = f"""set -e
idx=$(mktemp)
trap 'rm -f -- "$idx"' EXIT
real=$({_GIT} rev-parse --git-path index)
# -p: git trusts an entry whose file is older than the index file (its racy-clean
# check); a copy with a new mtime would hide an edit made in the same clock tick.
if [ -f "$real" ]; then cp -p -- "$real" "$idx"; else rm -f -- "$idx"; fi
export GIT_INDEX_FILE="$idx"
{_GIT} add -A .
excludes=()
while IFS=$'\\t' read -r -d '' added deleted path; do
  if [ "$added" = - ]; then excludes+=(":(top,exclude,literal)$path"); fi
done < <({_GIT} diff --cached --no-renames --no-textconv --numstat -z "$1")
{_GIT} diff --cached --no-renames --no-ext-diff --no-textconv --no-color \
  --src-prefix=a/ --dst-prefix=b/ "$1" -- . "${{excludes[@]}}"
"""


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
    base = base_commit or "HEAD"
    r = await sandbox.exec(
        f"bash -c {shlex.quote(_DIFF_SCRIPT)} submit {shlex.quote(base)}", cwd=repo, timeout=600
    )
    if not r.ok:
        raise ToolError(f"Could not compute the diff of {repo} against {base}: {r.stderr.strip()}")
    return r.stdout


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
