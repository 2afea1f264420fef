"""The labels every remote sandbox carries, and the run id that ``sandlot gc --run-id`` matches.

A *run* is one process tree: the id is ``$SANDLOT_RUN_ID`` when set, else drawn once and then
*written into this process's environment* (``SANDLOT_RUN_ID``), so every backend, every thread
and every child process labels its sandboxes with the same id. The first time a process uses its
id it also appends a record to the run log ``<state dir>/runs.jsonl`` (``$SANDLOT_STATE_DIR``,
else ``$XDG_STATE_HOME/sandlot``, else ``~/.local/state/sandlot``) and logs it, so that after a
crash, even ``kill -9``, the id can be found and ``sandlot gc --run-id <id>`` removes everything
the run left behind.

Label keys (docker labels, Modal tags, veFaaS metadata): ``sandlot.run_id``,
``sandlot.created_at`` (unix seconds), ``sandlot.owner`` (``user@host``), ``sandlot.sandbox_id``.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from sandlot.settings import settings

log = logging.getLogger("sandlot.sandboxes")

RUN_ID_ENV = "SANDLOT_RUN_ID"
RUN_ID = "sandlot.run_id"
CREATED_AT = "sandlot.created_at"
OWNER = "sandlot.owner"
SANDBOX_ID = "sandlot.sandbox_id"

_recorded: str | None = None
_lock = threading.Lock()


def state_dir() -> Path:
    """Where sandlot keeps per-user state (the run log)."""
    explicit = settings().state_dir
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sandlot"


def pin_run_id() -> str:
    """``$SANDLOT_RUN_ID``, set to a new id first if it is unset. Cheap; writes no file.

    ``Sandbox.start()`` calls it for backends that leave nothing behind to collect (``local``),
    so that their child processes still inherit the run's id without a run-log record.
    """
    with _lock:
        value = settings().run_id
        if not value:
            value = uuid.uuid4().hex[:12]
            os.environ[RUN_ID_ENV] = value
        return value


_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_RUN_ID_MAX = 63  # a label value every backend accepts (docker labels, Modal tags, veFaaS)


def forwarded_env() -> dict[str, str]:
    """The environment Ray actors need to label and reach sandboxes as this process does:
    every ``SANDLOT_*`` variable (the run id among them), ``DEPLOYMENT`` and ``DOCKER_HOST``.
    Secrets are not forwarded."""
    pin_run_id()
    keep = ("DEPLOYMENT", "DOCKER_HOST", "CONTAINERS_CONF")
    return {k: v for k, v in os.environ.items() if k.startswith("SANDLOT_") or k in keep}


def use_run_id(value: str) -> str:
    """Make ``value`` this process tree's run id (``$SANDLOT_RUN_ID``): the id a user chose
    with ``--run-id``, so ``sandlot gc --run-id <value>`` finds the run's sandboxes.

    Args:
        value: 1 to 63 characters out of letters, digits, ``.``, ``_`` and ``-``.

    Raises:
        ValueError: ``value`` is empty, too long, or has other characters (the message says
            which).
    """
    bad = sorted(set(value) - _RUN_ID_CHARS)
    if not value or len(value) > _RUN_ID_MAX or bad:
        raise ValueError(
            f"run id {value!r} must be 1 to {_RUN_ID_MAX} letters, digits, '.', '_' or '-'"
            + (f" (not {''.join(bad)!r})" if bad else "")
        )
    with _lock:
        os.environ[RUN_ID_ENV] = value
    return value


def run_id() -> str:
    """The id of this run (:func:`pin_run_id`), recorded in the run log on first use.

    The first call per id appends ``{"run_id", "pid", "owner", "started_at", "argv"}`` to
    ``<state dir>/runs.jsonl`` (best effort: an unwritable state dir only logs a warning).
    """
    global _recorded
    value = pin_run_id()
    with _lock:
        if _recorded == value:
            return value
        _recorded = value
    _record_run(value)
    return value


def _record_run(value: str) -> None:
    record = {
        "run_id": value,
        "pid": os.getpid(),
        "owner": owner(),
        "started_at": int(time.time()),
        "argv": sys.argv,
    }
    path = state_dir() / "runs.jsonl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        log.warning("cannot record run id %s in %s: %s", value, path, exc)
    log.info("sandlot run id %s (after a crash: sandlot gc --run-id %s)", value, value)


def recorded_runs() -> list[dict[str, object]]:
    """The records of ``runs.jsonl``, oldest first; unreadable lines are skipped."""
    path = state_dir() / "runs.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    runs = []
    for line in lines:
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return runs


def owner() -> str:
    """``user@host`` of this process (the uid when the user has no name here)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def sandbox_labels(sandbox_id: str, extra: Mapping[str, str]) -> dict[str, str]:
    """``extra`` (``spec.labels``) plus the ``sandlot.*`` labels, which take precedence."""
    return {
        **extra,
        RUN_ID: run_id(),
        CREATED_AT: str(int(time.time())),
        OWNER: owner(),
        SANDBOX_ID: sandbox_id,
    }
