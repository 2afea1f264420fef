"""``sandlot gc --backend local``: what local sandboxes of crashed callers left on this machine.

A local sandbox is its host directory (``<root>/<id>``, see
:func:`~sandlot.sandboxes.local.hostdirs.sandboxes_dir`) holding ``labels.json`` (the
``sandlot.*`` labels plus the caller's pid), its pids (and cpu) cgroup named after its id, and
its processes: the jail (``bwrap``, whose command line names the directory) or, without a jail,
the init (working directory inside it) and the commands carrying ``SANDLOT_EXEC_ID=<id>.N``.
A caller killed with ``kill -9`` leaves the directory and the cgroups (bubblewrap's
``--die-with-parent`` ends the jail itself); :class:`LocalReaper` removes all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import anyio

from sandlot.errors import SandboxError
from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.local.cgroup import sandbox_cgroups
from sandlot.sandboxes.local.hostdirs import (
    LABELS_FILE,
    foreign_dir,
    remove_tree,
    sandboxes_dir,
    unmount,
)
from sandlot.sandboxes.transport import RemoteSandbox


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes_of(root: Path, sandbox_id: str) -> list[int]:
    """Host pids of the jail, the init, and the commands of the sandbox in directory ``root``."""
    needle, marker = os.fsencode(root), f"SANDLOT_EXEC_ID={sandbox_id}.".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
                continue
            cwd = os.readlink(f"/proc/{entry}/cwd")
            if cwd == str(root) or cwd.startswith(f"{root}/"):
                found.append(int(entry))
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            if any(e.startswith(marker) for e in environ):
                found.append(int(entry))
        except OSError:
            continue
    return found


class LocalReaper:
    """Lists and removes local sandboxes.

    Args:
        root_dir: the ``LocalOptions.root_dir`` the sandboxes were made under (``None``: the
            default, ``$SANDLOT_LOCAL_ROOT`` or ``<tmp>/sandlot-local-<uid>``).
    """

    backend = "local"

    def __init__(self, root_dir: str | None = None) -> None:
        self.root = sandboxes_dir(root_dir)

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Sandbox directories under the root; ``state`` says whether their caller still runs.

        A directory without a readable ``labels.json`` is listed with no labels (so only
        ``--all`` selects it).
        """
        return await anyio.to_thread.run_sync(self._list, run_id)

    def _list(self, run_id: str | None) -> list[RemoteSandbox]:
        found: list[RemoteSandbox] = []
        if not self.root.is_dir():
            return found
        if problem := foreign_dir(self.root):
            raise SandboxError(f"sandlot gc --backend local: {problem}")
        for entry in sorted(self.root.iterdir()):
            if not entry.is_dir() or not entry.name.startswith("sandlot-"):
                continue
            try:
                data = json.loads((entry / LABELS_FILE).read_text())
                labels = {str(k): str(v) for k, v in data["labels"].items()}
                pid = int(data["pid"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                labels, pid = {}, 0
            if run_id is not None and labels.get(RUN_ID) != run_id:
                continue
            state = "caller running" if pid and _alive(pid) else "orphaned"
            found.append(RemoteSandbox(self.backend, entry.name, labels, state, handle=entry))
        return found

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Kill the sandbox's processes, remove its cgroups and its directory."""
        root: Path = sandbox.handle
        for pid in await anyio.to_thread.run_sync(_processes_of, root, sandbox.id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for cgroup in sandbox_cgroups(sandbox.id):
            await cgroup.destroy()
        await anyio.to_thread.run_sync(unmount, root)
        await anyio.to_thread.run_sync(remove_tree, root)
