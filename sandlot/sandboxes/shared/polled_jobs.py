"""Commands as polled jobs over an exec that is one request and one answer: launch, poll, kill.

Some transports run a command only as a request whose answer is its whole output (SWE-ReX's
``/execute`` runs a blocking ``subprocess.run`` inside its event loop): one long request stalls
every other request to the instance, a command's background jobs keep the response open, and a
timeout loses all output. So a command there is a *job*: a short request launches it detached
(``setsid``) with stdout, stderr and the exit status going to files in
``/tmp/sandlot-jobs/<id>/`` and waits up to 50 ms for it (a quick command is done in one round
trip); otherwise short polls collect the result, at most ``cap`` bytes per stream, base64-encoded
(the files may hold any bytes); on timeout the job's processes are killed and what they printed
so far is collected. No request lasts longer than a few seconds.

Every process of a job carries ``SANDLOT_EXEC_ID=<id>`` in its environment, which is how a
timed-out job's processes are found and killed (see :mod:`sandlot.sandboxes.shared.remote_shell`).
Background processes a finished job left (they hold only its files) live on until the sandbox
closes, as with ``docker exec``. A repeated launch (an HTTP retry) is a no-op: the job
directory is created with ``mkdir``, which fails the second time.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import logging
import uuid
from collections.abc import Mapping

from sandlot.errors import SandboxError, SandlotError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.scale.backoff import poll
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.shared.remote_shell import EXEC_MARKER_ENV
from sandlot.sandboxes.transport import RunOutput, RunRequest

log = logging.getLogger("sandlot.sandboxes")

JOBS_DIR = "/tmp/sandlot-jobs"

# Runs detached. $1 = job dir, $2 = cwd, $3 = command line, then NAME=VALUE pairs for `env`.
_RUN = """
d=$1; cwd=$2; cmd=$3; shift 3
in=/dev/null; [ -e "$d.stdin" ] && in="$d.stdin"
(
  cd -- "$cwd" || exit
  if command -v bash >/dev/null 2>&1; then exec env "$@" bash -c "$cmd"
  else exec env "$@" sh -c "$cmd"; fi
) <"$in" >"$d/out" 2>"$d/err"
rc=$?
echo "$rc" >"$d/rc.tmp" && mv "$d/rc.tmp" "$d/rc"
"""

# $0 = the poll script, $1 = _RUN, $2 = SANDLOT_EXEC_ID=<id>, $3 = job dir, $4 = bytes kept per
# stream, then _RUN's arguments after the job dir. Starts the job (only it carries the marker,
# by which a timeout kills its processes), waits up to 50 ms for it (most commands of an agent
# are that quick), then answers like a poll. A repeated launch only polls.
_LAUNCH = """
poll=$0; run=$1; marker=$2; d=$3; cap=$4; shift 4
if mkdir -p "$(dirname -- "$d")" && mkdir -- "$d" 2>/dev/null; then
  setsid env "$marker" sh -c "$run" sandlot-job "$d" "$@" </dev/null >/dev/null 2>&1 &
  i=0; while [ ! -e "$d/rc" ] && [ "$i" -lt 10 ]; do sleep 0.005; i=$((i+1)); done
fi
exec sh -c "$poll" sandlot-poll "$d" "$cap" ""
"""

# $1 = job dir, $2 = bytes kept per stream, $3 = "force" to collect an unfinished job.
# Prints "running", "missing", or "<rc|-> <stdout size> <stderr size>" then two base64 lines,
# and removes the job once collected.
_POLL = """
d=$1
[ -d "$d" ] || { echo missing; exit 0; }
if [ -e "$d/rc" ]; then rc=$(cat "$d/rc")
elif [ "$3" = force ]; then rc=-
else echo running; exit 0; fi
echo "$rc $(wc -c <"$d/out") $(wc -c <"$d/err")"
head -c "$2" "$d/out" | base64 | tr -d '\\n'; echo
head -c "$2" "$d/err" | base64 | tr -d '\\n'; echo
rm -rf -- "$d" "$d.stdin"
"""


def job_dir(job_id: str) -> str:
    """Directory of the job ``job_id`` inside the sandbox."""
    return f"{JOBS_DIR}/{job_id}"


def stdin_path(job_id: str) -> str:
    """Where the job's standard input is uploaded before launch."""
    return f"{job_dir(job_id)}.stdin"


def launch_argv(job_id: str, cwd: str, command: str, env: Mapping[str, str], cap: int) -> list[str]:
    """argv (for ``/execute``, ``shell=False``) starting the job detached, then polling it once
    (its output is :func:`parse_poll`'s input)."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    marker = f"{EXEC_MARKER_ENV}={job_id}"
    head = ["/bin/sh", "-c", _LAUNCH, _POLL, _RUN, marker, job_dir(job_id), str(cap)]
    return [*head, cwd, command, *pairs]


def poll_argv(job_id: str, cap: int, *, force: bool = False) -> list[str]:
    """argv reporting the job's state, collecting (and removing) it once ended or ``force``."""
    return [
        "/bin/sh",
        "-c",
        _POLL,
        "sandlot-poll",
        job_dir(job_id),
        str(cap),
        "force" if force else "",
    ]


class JobLostError(SandlotError):
    """The job directory vanished before its result was collected."""


def parse_poll(stdout: str) -> RunOutput | None:
    """The result printed by the poll script, or ``None`` while the job runs.

    Raises:
        JobLostError: the job directory is gone.
        ValueError: the output is not what the script prints.
    """
    lines = stdout.split("\n")
    head = lines[0].strip()
    if head == "running":
        return None
    if head == "missing":
        raise JobLostError("the job's directory is gone")
    rc, out_size, err_size = head.split()
    out, err = base64.b64decode(lines[1]), base64.b64decode(lines[2])
    return RunOutput(
        exit_code=None if rc == "-" else int(rc),
        stdout=out,
        stderr=err,
        stdout_dropped=max(0, int(out_size) - len(out)),
        stderr_dropped=max(0, int(err_size) - len(err)),
    )


_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.25


class PolledJobs(Sandbox):
    """A transport without streaming exec: ``_run`` as a job over :meth:`_execute`.

    A subclass implements :meth:`_execute` and :meth:`_upload`, and sets :attr:`job_cap` and
    :attr:`job_grace_s` (usually from its options).
    """

    job_cap: int
    """Bytes of stdout and of stderr kept per command."""
    job_grace_s: float
    """Seconds a timed-out or cancelled command gets between SIGTERM and SIGKILL."""
    job_call_s: float = 60.0
    """Timeout of one launch, poll or kill request (seconds)."""

    @abc.abstractmethod
    async def _execute(self, argv: list[str], timeout: float, *, probe: bool = True) -> str:
        """Run ``argv`` (no shell) to its end; its stdout. ``probe=False``: a failure is raised
        as it is, without a liveness probe (the stop of a job already failing)."""

    @abc.abstractmethod
    async def _upload(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` as it is (no parents created)."""

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``command`` as a detached job (see :meth:`Transport._run`).

        No request lasts as long as the command: a launch that waits up to 50 ms for it, then
        polls (10 ms doubling to 0.25 s). At ``timeout`` or on cancellation every process of
        the command is killed (SIGTERM, ``job_grace_s``, SIGKILL) and the output printed so far
        is returned (up to ``job_cap`` bytes per stream).

        Raises:
            SandboxDeadError: the sandbox is no longer running.
            SandboxError: the transport failed, or the job's result was lost.
        """
        job = uuid.uuid4().hex
        if run.stdin:
            await self._upload(stdin_path(job), run.stdin)
        argv = launch_argv(job, run.cwd, run.command, run.env, self.job_cap)
        first = self._parse(await self._execute(argv, self.job_call_s))
        if first is not None:
            return first
        stopped = RunOutput(exit_code=None)

        async def wait() -> RunOutput:
            return await poll(lambda: self._poll(job), first_s=_POLL_FIRST_S, max_s=_POLL_MAX_S)

        async def stop() -> None:
            nonlocal stopped
            stopped = await self._stop_job(job)

        done = await self._bounded(run.timeout, wait, stop)
        return stopped if done is None else done

    async def _poll(self, job: str, *, force: bool = False) -> RunOutput | None:
        argv = poll_argv(job, self.job_cap, force=force)
        return self._parse(await self._execute(argv, self.job_call_s))

    def _parse(self, stdout: str) -> RunOutput | None:
        try:
            return parse_poll(stdout)
        except (JobLostError, ValueError) as exc:
            raise SandboxError(
                f"sandbox {self.id}: lost the result of a command: {exc} (its answer was lost, "
                "or the sandbox restarted)"
            ) from exc

    async def _stop_job(self, job: str) -> RunOutput:
        """Kill the job's processes and collect what they printed."""
        argv = remote_shell.kill_argv(job, self.job_grace_s)
        try:
            await self._execute(argv, self.job_grace_s + self.job_call_s, probe=False)
            result = await self._poll(job, force=True)
        except SandboxError as exc:
            log.warning("sandbox %s: could not stop command %s: %s", self.id, job, exc)
            return RunOutput(exit_code=None)
        assert result is not None
        return dataclasses.replace(result, exit_code=None)
