"""A fake container for the cloud fakes: a private root directory entered with bubblewrap.

The host's system directories are bound read-only; everything else (``/tmp``, the workdir,
whatever a command creates) lands in the sandbox's own writable root directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Host paths that are not bound (the fake container gets its own or none).
_PRIVATE = {"proc", "dev", "sys", "tmp", "run", "testbed", "lost+found", "old_root", "mnt", "media"}


def bwrap_missing() -> str | None:
    """Why the fakes cannot run here, or ``None``."""
    return None if shutil.which("bwrap") else "bubblewrap (bwrap) is not installed"


def jail_argv(
    root: Path, *, network: bool, own_pids: bool, env: dict[str, str], cwd: str = "/"
) -> list[str]:
    """bwrap argv running a command with ``root`` as ``/`` and the host's system dirs read-only.

    Args:
        root: the container's writable root directory on the host.
        network: share the host's network; ``False`` gives a namespace with loopback only.
        own_pids: a PID namespace of its own (everything dies with its first process).
        env: the complete environment of the command.
        cwd: working directory inside.
    """
    argv = ["bwrap", "--bind", str(root), "/"]
    for entry in sorted(os.listdir("/")):
        host = Path("/") / entry
        if entry in _PRIVATE:
            continue
        if host.is_symlink():
            if not os.path.lexists(root / entry):  # made once, in the root directory itself
                os.symlink(os.readlink(host), root / entry)
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{entry}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--die-with-parent", "--clearenv"]
    if not network:
        argv.append("--unshare-net")
    if own_pids:
        argv.append("--unshare-pid")
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", cwd, "--"]
    return argv


def make_root(parent: Path, name: str) -> Path:
    """A new container root under ``parent`` with an empty ``/tmp``."""
    root = parent / name
    (root / "tmp").mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    return root
