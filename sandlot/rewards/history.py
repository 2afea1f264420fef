"""No future of the repository in a sandbox: only ``HEAD`` and its history stay.

Whatever put the repository there (a clone from ``repo_source``, a dataset's image), the
commits after ``base_commit`` — the upstream fix among them — must not be reachable: an agent
reads them with ``git log --all`` (SWE-bench issue #465), and a model patch can ``git show``
them while the tests run. :func:`hide_future` runs
:func:`sandlot.datasets.git_history.strip_future_history_cmd` (what it removes is listed
there) in the work directory; :func:`sandlot.rewards.instance_setup.prepare_repo` calls it once
the repository is set up, for the agent's sandbox and the evaluation's alike. Cost: one
``git gc`` of the history: about 2 s for a 3,000-commit repository on 2 cores.
"""

from __future__ import annotations

import logging

from sandlot.datasets.git_history import strip_future_history_cmd
from sandlot.datasets.instance import Instance
from sandlot.errors import SandboxSetupError
from sandlot.sandboxes.base import Sandbox, output_tail

log = logging.getLogger(__name__)


async def hide_future(sb: Sandbox, instance: Instance) -> None:
    """Leave only ``HEAD``'s history in ``instance.workdir``'s repository; a work directory
    that is not a git repository is left as it is.

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
            step="remove the repository's history after base_commit",
        )
    log.debug("%s: history after base_commit removed", instance.instance_id)
