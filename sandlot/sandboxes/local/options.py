"""``LocalOptions``: settings of the ``local`` backend that no other backend has."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024

DEFAULT_HIDDEN_PATHS: tuple[str, ...] = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.pypirc",
    "~/.npmrc",
    "~/.modal.toml",
    "~/.cache/huggingface/token",
    "~/.huggingface/token",
    "~/.claude",
    "~/.bash_history",
    "~/.config",
    "~/.kaggle",
    "~/.env",
    "~/.gitconfig",
    "~/.git-credentials",
    "/etc/shadow",
    "/etc/gshadow",
)
"""Host paths masked inside ``image="host"`` jails with ``host_view="full"``: credential stores
of the invoking user's home (``~`` is the home the password database gives for our uid, and
``$HOME`` as well when it differs) and the password hashes. Model-written commands are hostile
input. With the default ``host_view="minimal"`` no home directory is visible at all."""

DEFAULT_INHERITED_ENV: tuple[str, ...] = ("PYENV_ROOT", "PYENV_VERSION")
"""Host variables copied into ``image="host"`` jails when set: they locate the host's toolchain
(pyenv shims need ``PYENV_ROOT`` once ``HOME`` points elsewhere) and hold no secrets. The
caller's ``VIRTUAL_ENV`` is not among them: the caller's Python is never the sandbox's."""


def home_paths(paths: Iterable[str]) -> list[str]:
    """``paths`` with a leading ``~/`` expanded to the invoking user's home from the password
    database and, when it differs, to ``$HOME`` as well: a caller (or a model-written config)
    that points ``HOME`` elsewhere must not unmask the real home."""
    homes = [pwd.getpwuid(os.getuid()).pw_dir]
    if os.environ.get("HOME") and os.environ["HOME"] not in homes:
        homes.append(os.environ["HOME"])
    out: list[str] = []
    for path in paths:
        out += [os.path.join(h, path[2:]) for h in homes] if path.startswith("~/") else [path]
    return out


class LocalOptions(BaseModel):
    """Options of the ``local`` backend (pass as ``sandlot.open("local", isolation="none")``).

    Attributes:
        isolation: ``"bwrap"`` runs every command in a bubblewrap jail; ``"none"`` runs commands
            directly on the host with no isolation at all (a WARNING is logged per sandbox).
        bwrap_path: name (looked up on ``PATH``) or absolute path of the ``bwrap`` executable.
        max_output_bytes: cap in bytes on each of stdout and stderr of one ``exec``; the head is
            kept, the rest is read and discarded, and the result is marked ``truncated``.
        max_processes: process cap of the sandbox: the ``pids.max`` of its pids cgroup when one
            can be created, and ``RLIMIT_NPROC`` (not enforced for real root; see the sandbox
            docstring).
        max_file_size_mb: largest file, in MiB, a command may write (``RLIMIT_FSIZE``).
        cpu_time_s: CPU seconds each process may use (``RLIMIT_CPU``), or ``None`` for no limit.
        pids_cgroup: put each sandbox in its own pids cgroup when the host allows it (cgroup v1
            ``pids`` hierarchy or a cgroup v2 subtree with ``pids`` delegated, writable by us).
        root_dir: host directory holding the per-sandbox directories; ``None`` uses
            ``$SANDLOT_LOCAL_ROOT``, else ``sandlot-local-<uid>`` in the system temporary
            directory. It must be a directory of the caller's that no one else may write to
            (else ``SandboxStartError``): another user could otherwise have made it first.
        hidden_paths: host paths replaced by an empty read-only directory (or ``/dev/null`` for a
            file) inside ``image="host"`` jails with ``host_view="full"``; a leading ``~/``
            means the invoking user's home (see :func:`home_paths`).
        inherit_env: names of host environment variables copied into ``image="host"`` jails when
            set. Nothing else of the host environment is passed.
        host_view: what of the host an ``image="host"`` jail shows, read-only. ``"minimal"``
            (default): the system directories (``/usr``, ``/bin``, ``/sbin``, ``/lib*``,
            ``/etc`` without its credentials), the interpreter the sandbox's init runs on and
            the cached environment of the recipe (with its base interpreter), and the
            sandbox's own writable directories; not ``/root``, ``/home``, ``/opt``, ``/var``,
            ``/srv``, ``/mnt``, the caller's working tree, datasets, other sandboxes or the
            container engine's storage. ``"full"``: every top-level host directory except
            ``/proc``, ``/dev``, ``/sys``, ``/tmp``, ``/run``, with only ``hidden_paths`` and
            the ``/etc`` credentials masked. RISK: with ``"full"`` a model-written command can
            read everything the calling user can read that is not masked, e.g. dataset files
            holding gold patches (a reward-hacking route), run logs, other tenants' container
            files under ``/var/lib/containers``, and any credential the mask list misses.
        zygote: start ``image="host"`` and container image jails (without ``disk_mb``) by
            forking them from a zygote, one long-lived process per jail shape and thread that
            has already paid for bwrap and the interpreter (:mod:`sandlot.sandboxes.local.zygote`;
            one serves every image of a shape, its child mounting the image's layers): the
            same jail, several times faster to open. ``False`` gives each sandbox its own
            bwrap, as do hosts where a zygote cannot start (logged once) and root filesystem
            directories.
    """

    model_config = ConfigDict(extra="forbid")

    isolation: Literal["bwrap", "none"] = "bwrap"
    bwrap_path: str = "bwrap"
    max_output_bytes: int = Field(default=10 * MIB, gt=0)
    max_processes: int = Field(default=4096, gt=0)
    max_file_size_mb: int = Field(default=4096, gt=0)
    cpu_time_s: int | None = Field(default=None, gt=0)
    pids_cgroup: bool = True
    root_dir: str | None = None
    hidden_paths: tuple[str, ...] = DEFAULT_HIDDEN_PATHS
    inherit_env: tuple[str, ...] = DEFAULT_INHERITED_ENV
    host_view: Literal["minimal", "full"] = "minimal"
    zygote: bool = True
