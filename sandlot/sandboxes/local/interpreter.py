"""Which Python runs a sandbox's init, and which interpreter trees the jail must show.

The init (:mod:`sandlot.sandboxes.local.init`) runs on this machine's interpreter for
``image="host"`` and on the image's own ``python3`` for a root filesystem directory. Cached
environments are virtualenvs whose ``bin/python`` links to a base interpreter named in their
``pyvenv.cfg``; a ``host_view="minimal"`` jail shows these trees read-only and nothing else of
where they live (a user's home, for pyenv or uv interpreters).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from sandlot.errors import SandboxStartError
from sandlot.images.root import ImageRoot

_IMAGE_PYTHONS = ("usr/local/bin/python3", "usr/bin/python3", "bin/python3")


def init_interpreter(rootfs: Path, image: ImageRoot | None = None) -> str:
    """The interpreter (path as the jail sees it) that runs the init of a sandbox on ``rootfs``,
    or on container image ``image`` (looked up through its layers).

    Raises:
        SandboxStartError: a root filesystem directory or image without ``python3``.
    """
    if rootfs == Path("/") and image is None:
        return _host_interpreter()
    for candidate in _IMAGE_PYTHONS:
        if image.executable("/" + candidate) if image else os.access(rootfs / candidate, os.X_OK):
            return "/" + candidate
    name = image.reference if image else str(rootfs)
    raise SandboxStartError(
        f"the local backend runs each sandbox's init with Python, but the root filesystem of "
        f"{name!r} has no python3 in /usr/local/bin, /usr/bin or /bin; add one to it"
    )


@functools.cache
def _host_interpreter() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def interpreter_prefixes() -> tuple[str, ...]:
    """Installation trees of the running interpreter: the base one the init runs on and, when
    we run in a virtualenv, that one too (commands may run ``sys.executable``)."""
    found = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)]
    return tuple(dict.fromkeys(p for p in found if os.path.isdir(p)))


def venv_base_prefix(venv: Path) -> str:
    """Installation tree of the base interpreter of virtualenv ``venv`` (from ``pyvenv.cfg``'s
    ``home``, the base interpreter's ``bin`` directory); ``venv`` itself when it names none."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return str(venv)
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(os.path.realpath(value.strip()))
            return str(home.parent if home.name == "bin" else home)
    return str(venv)
