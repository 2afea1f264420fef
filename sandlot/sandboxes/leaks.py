"""The run's leak list: sandboxes that ``close`` could not destroy, for ``sandlot gc --leaked``.

When a sandbox's destroy fails for good (its retries within the close budget used up: a Modal
``terminate`` that never answers, a veFaaS ``KillSandbox`` that keeps failing, a docker remove
refused), :meth:`Sandbox.close <sandlot.sandboxes.base.Sandbox.close>` calls :func:`report`,
which logs it with the backend's id and the exact ``sandlot gc`` command, counts it
(:func:`leaked_sandboxes`) and appends one JSON line to the run's leak list
``<state dir>/leaks/<run id>.jsonl`` (the state dir of :func:`sandlot.sandboxes.labels.state_dir`:
``$SANDLOT_STATE_DIR``, else ``$XDG_STATE_HOME/sandlot``, else ``~/.local/state/sandlot``).
``sandlot gc --leaked`` kills exactly the sandboxes listed there and drops the entries of those
that are gone (:func:`forget`).

Appends and rewrites hold the file's ``filelock`` lock (``<file>.lock``), and each entry is
one ``write`` on a file opened with ``O_APPEND``: many sandboxes closing at once in one process,
and several processes of one run, never interleave or lose lines.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
from filelock import FileLock

from sandlot.sandboxes.labels import state_dir

log = logging.getLogger("sandlot.sandboxes.leaks")

_LOCK_TIMEOUT_S = 30.0
# The option fields that say where a backend's sandboxes live, which its reaper takes (never
# credentials: the leak list is a plain file).
_LOCATORS = {
    "docker": ("base_url",),
    "local": ("root_dir",),
    "modal": ("app_name",),
    "vefaas": ("function_id", "region", "endpoint"),
    "kubernetes": ("namespace", "kubeconfig", "context"),
}

_counts: Counter[str] = Counter()
# (run id, backend, sandbox id) listed by this process: a sandbox whose failed start attempts
# and final close all leave something behind is one entry (gc matches its label).
_listed: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Leak:
    """One entry of a leak list.

    Attributes:
        backend: the backend's name (``modal``, ``docker``, ...).
        run_id: the run whose list holds it (``sandlot.run_id``).
        sandbox_id: sandlot's id (``sandlot-...``, the ``sandlot.sandbox_id`` label).
        backend_id: the platform's id (Modal ``sb-...``, container id), when known.
        error: why the destroy failed.
        options: the reaper settings that find it (e.g. ``{"app_name": "rl"}``).
    """

    backend: str
    run_id: str
    sandbox_id: str
    backend_id: str | None = None
    error: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @property
    def gc_command(self) -> str:
        """The command that kills it (and the other leaks of its run on its backend)."""
        argv = ["sandlot", "gc", "--backend", self.backend, "--leaked", "--run-id", self.run_id]
        for key, value in sorted(self.options.items()):
            argv += ["--option", f"{key}={value}"]
        return shlex.join(argv)


def locator_options(backend: str, options: object) -> dict[str, str]:
    """The fields of ``options`` (a backend's options model) its reaper needs, as strings."""
    found = {key: getattr(options, key, None) for key in _LOCATORS.get(backend, ())}
    return {key: str(value) for key, value in found.items() if value is not None}


def leak_file(run_id: str) -> Path:
    """``<state dir>/leaks/<run_id>.jsonl``."""
    return state_dir() / "leaks" / f"{run_id}.jsonl"


def leaked_sandboxes(backend: str | None = None) -> int:
    """How many sandboxes of this process (of ``backend`` only, when given) were reported by
    :func:`report`: closed by sandlot, yet possibly still running and billed."""
    return sum(n for name, n in _counts.items() if backend is None or name == backend)


async def report(leak: Leak) -> None:
    """Log ``leak``; count it and append it to its run's leak list unless this process listed
    the sandbox already. Never raises (an unwritable state dir is logged: the log line still
    names the command)."""
    log.error(
        "sandbox %s (%s %s) could not be destroyed and may still run: %s; remove it with `%s`",
        leak.sandbox_id,
        leak.backend,
        leak.backend_id or "id unknown",
        leak.error,
        leak.gc_command,
    )
    key = (leak.run_id, leak.backend, leak.sandbox_id)
    if key in _listed:
        return
    _listed.add(key)
    _counts[leak.backend] += 1
    try:
        await anyio.to_thread.run_sync(_append, leak)
    except Exception as exc:  # the leak is logged above; the list is the convenience
        log.warning("cannot add sandbox %s to %s: %s", leak.sandbox_id, leak_file(leak.run_id), exc)


def _append(leak: Leak) -> None:
    path = leak_file(leak.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(asdict(leak)) + "\n").encode()
    with FileLock(f"{path}.lock", timeout=_LOCK_TIMEOUT_S):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read(run_id: str | None = None) -> list[Leak]:
    """The entries of ``run_id``'s leak list (of every run's when ``None``), oldest first;
    unreadable lines are skipped."""
    folder = state_dir() / "leaks"
    paths = [leak_file(run_id)] if run_id else sorted(folder.glob("*.jsonl"))
    leaks = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                leaks.append(Leak(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return leaks


def forget(run_id: str, sandbox_ids: set[str]) -> None:
    """Remove the entries of ``sandbox_ids`` from ``run_id``'s leak list (the file, once
    empty). Lines appended meanwhile by a running process are kept.

    Raises:
        OSError: the list cannot be rewritten.
        filelock.Timeout: another process held its lock for 30 s.
    """
    path = leak_file(run_id)
    with FileLock(f"{path}.lock", timeout=_LOCK_TIMEOUT_S):
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except FileNotFoundError:
            return
        kept = [line for line in lines if _sandbox_id(line) not in sandbox_ids]
        if kept:
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            tmp.replace(path)
        else:
            path.unlink()


def _sandbox_id(line: str) -> str | None:
    try:
        return str(json.loads(line)["sandbox_id"])
    except (ValueError, KeyError, TypeError):
        return None
