"""Labels put on every container so ``sandlot gc`` (and people) can find and attribute them."""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from collections.abc import Mapping

RUN_ID_ENV = "SANDLOT_RUN_ID"
RUN_ID = "sandlot.run_id"
CREATED_AT = "sandlot.created_at"
OWNER = "sandlot.owner"
SANDBOX_ID = "sandlot.sandbox_id"

_process_run_id = uuid.uuid4().hex[:12]


def run_id() -> str:
    """``$SANDLOT_RUN_ID`` if set, else an id drawn once per process."""
    return os.environ.get(RUN_ID_ENV) or _process_run_id


def owner() -> str:
    """``user@host`` of this process (the uid when the user has no name here)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def sandbox_labels(sandbox_id: str, extra: Mapping[str, str]) -> dict[str, str]:
    """``extra`` (``spec.labels``) plus the ``sandlot.*`` labels, which take precedence.

    ``sandlot.created_at`` is in unix seconds.
    """
    return {
        **extra,
        RUN_ID: run_id(),
        CREATED_AT: str(int(time.time())),
        OWNER: owner(),
        SANDBOX_ID: sandbox_id,
    }
