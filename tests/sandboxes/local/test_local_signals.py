"""``local`` commands start with default signal dispositions, whatever their parent ignores.

A background job (``nohup sandlot rollout ... &``, a batch script) runs with SIGINT and
SIGQUIT ignored, and a process inherits ignored signals across fork and exec. A shell that
starts with SIGINT ignored cannot trap it, so a session's timeout (SIGINT first) could only kill
the shell, losing the agent's cwd, environment and jobs. A container runtime starts its processes
with every signal at its default action; ``local`` must too. Each case runs in a child Python
whose SIGINT and SIGQUIT are ignored and SIGUSR1 blocked, as such a job's are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from local_helpers import needs_bwrap
from repo_paths import REPO

_CHECKOUT = REPO

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import anyio
    import sandlot
    from sandlot.runtimes import SessionConfig

    async def main() -> None:
        async with sandlot.open("local", isolation=sys.argv[1]) as sb:
            status = (await sb.exec("grep -E '^Sig(Ign|Blk):' /proc/self/status")).stdout
            session = await sb.shell("s", config=SessionConfig(interrupt_grace_s=0.3))
            await session.run("cd /tmp && export SANDLOT_KEPT=yes")
            r = await session.run("sleep 300", timeout=0.5)
            after = await session.run('echo "$SANDLOT_KEPT $PWD"')
            print(json.dumps({"status": status, "timed_out": r.timed_out,
                              "restarted": r.shell_restarted, "after": after.output}))

    anyio.run(main)
    """
)


def _as_a_background_job() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def _run_ignoring_sigint(isolation: str) -> dict[str, object]:
    path = os.pathsep.join(filter(None, [str(_CHECKOUT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, isolation],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=_as_a_background_job,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("isolation", [pytest.param("bwrap", marks=needs_bwrap), "none"])
def test_session_timeout_keeps_the_shell_under_a_parent_ignoring_sigint(isolation: str) -> None:
    out = _run_ignoring_sigint(isolation)
    # No standard signal (1 to 31: bit N-1 of the hex masks) ignored or blocked. glibc keeps 32
    # and 33 for itself (no program can reset them); an outer parent may have ignored them.
    for line in str(out["status"]).splitlines():
        assert int(line.split(":")[1], 16) & 0x7FFFFFFF == 0, out["status"]
    assert (out["timed_out"], out["restarted"]) == (True, False)
    assert out["after"] == "yes /tmp\n"
