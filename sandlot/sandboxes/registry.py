"""Backend registry: built-in backends plus the ``sandlot.backends`` entry-point group.

A third-party package registers a backend by declaring, in its ``pyproject.toml``::

    [project.entry-points."sandlot.backends"]
    mycloud = "mypkg.sandbox:MyCloudSandbox"

Backend classes are imported lazily, so a cloud SDK is imported only when its backend is used.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from importlib.metadata import entry_points

from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.base import Sandbox
from sandlot.settings import settings

ENTRY_POINT_GROUP = "sandlot.backends"
DEFAULT_BACKEND = "local"

_BUILTIN: dict[str, str] = {
    "local": "sandlot.sandboxes.local.sandbox:LocalSandbox",
    "docker": "sandlot.sandboxes.docker:DockerSandbox",
    "modal": "sandlot.sandboxes.modal:ModalSandbox",
    "vefaas": "sandlot.sandboxes.vefaas:VefaasSandbox",
}
_registered: dict[str, type[Sandbox]] = {}


def register_backend(name: str, cls: type[Sandbox]) -> None:
    """Register ``cls`` under ``name`` for this process (overrides built-ins and entry points)."""
    _registered[name] = cls


@functools.cache
def _entry_point_targets() -> dict[str, str]:
    # Scanning the installed distributions costs tens of milliseconds; they do not change
    # while a process runs (register_backend covers backends added at run time).
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    """Sorted names of every backend known here (built-in, entry point, registered)."""
    return sorted({*_BUILTIN, *_entry_point_targets(), *_registered})


def resolve_backend_name(name: str | None = None) -> str:
    """Pick the backend: ``name``, else ``$SANDLOT_BACKEND``, else ``$DEPLOYMENT``, else local."""
    env = settings()
    for candidate in (name, env.backend, env.deployment):
        if candidate:
            return candidate.strip().lower()
    return DEFAULT_BACKEND


def backend_source(name: str | None = None) -> str | None:
    """Where :func:`resolve_backend_name` takes its answer from: ``"$SANDLOT_BACKEND"`` or
    ``"$DEPLOYMENT"``; ``None`` when it is ``name`` itself or the default."""
    if name:
        return None
    env = settings()
    if env.backend:
        return "$SANDLOT_BACKEND"
    return "$DEPLOYMENT" if env.deployment else None


def check_backend_name(name: str, source: str | None = None) -> None:
    """Raise unless ``name`` (already resolved: stripped, lower case) is a known backend.

    Args:
        name: the backend name.
        source: where the name was set, for the message (``"$SANDLOT_BACKEND"``, a config
            file's key, ...); ``None`` when the caller passed it (``--backend``, ``backend=``).

    Raises:
        BackendNotFoundError: unknown name; the message names where it was set, the known
            backends, the closest one and how to fix it.
    """
    if name in _registered or name in _BUILTIN or name in _entry_point_targets():
        return
    known = available_backends()
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if source is None:
        where, fix = "", f"other backends register in the {ENTRY_POINT_GROUP!r} entry-point group"
    else:
        where = f" (set by {source})"
        if source.startswith("$"):
            suggestion = close[0] if close else DEFAULT_BACKEND
            fix = f"fix or unset {source[1:]} (e.g. `export {source[1:]}={suggestion}`)"
        else:
            fix = f"fix {source}"
        fix += ", or name a backend with --backend (backend= in Python)"
    raise BackendNotFoundError(
        f"unknown sandbox backend {name!r}{where}; known backends: {', '.join(known)}{hint}; {fix}"
    )


def get_backend(name: str | None = None) -> type[Sandbox]:
    """Return the ``Sandbox`` subclass for ``name`` (resolved with :func:`resolve_backend_name`).

    Raises:
        BackendNotFoundError: no backend has that name; the message says where the name came
            from (``name``, ``$SANDLOT_BACKEND`` or ``$DEPLOYMENT``) and lists the known ones.
    """
    resolved = resolve_backend_name(name)
    check_backend_name(resolved, backend_source(name))
    if resolved in _registered:
        return _registered[resolved]
    target = _BUILTIN.get(resolved) or _entry_point_targets()[resolved]
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise BackendNotFoundError(f"backend {resolved!r} points at {target}, not a Sandbox class")
    return cls
