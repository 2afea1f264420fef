"""The external tools images need, found on ``PATH`` or named in a one-line install hint.

skopeo speaks the registry protocol (token auth, ``~/.docker/config.json`` and credential
helpers, ``registries.conf``, mirrors, platform choice, digest verification); the kernel's
overlayfs, mounted in a user namespace by bwrap itself (0.9 and later) or else by util-linux's
``unshare`` and ``mount``, stacks the layers. See ``docs/images.md`` for why these and not umoci.
"""

from __future__ import annotations

import shutil

from sandlot.errors import BackendUnavailableError

INSTALL_HINTS = {
    "skopeo": "apt-get install skopeo (Debian/Ubuntu), dnf install skopeo (Fedora), "
    "brew install skopeo",
    "unshare": "apt-get install util-linux",
    "mount": "apt-get install mount",
    "sh": "apt-get install dash",
    "bash": "apt-get install bash",
    "setpriv": "apt-get install util-linux",
    "mountpoint": "apt-get install util-linux",
    "tar2sqfs": "apt-get install squashfs-tools-ng (or SANDLOT_IMAGE_LAYERS=unpack)",
    "squashfuse": "apt-get install squashfuse (or SANDLOT_IMAGE_LAYERS=unpack)",
}


def find_tool(name: str) -> str:
    """Absolute path of executable ``name`` on ``PATH``.

    Raises:
        BackendUnavailableError: it is not installed (the message says how to install it).
    """
    path = shutil.which(name)
    if path is None:
        raise BackendUnavailableError(
            f"container images on the local backend need {name}, which is not on PATH: "
            f"{INSTALL_HINTS.get(name, 'install ' + name)}"
        )
    return path
