"""Backend registry: built-in backends plus the ``sandlot.backends`` entry-point group.

A third-party package registers a backend by declaring, in its ``pyproject.toml``::

    [project.entry-points."sandlot.backends"]
    mycloud = "mypkg.sandbox:MyCloudSandbox"

Backend classes are imported lazily, so a cloud SDK is imported only when its backend is used.

Which backend a run uses is decided here, once, by :func:`choose_backend`, in the usual order of
a CLI tool: the argument (``--backend``, ``backend=``), then ``$SANDLOT_BACKEND``, then
``$DEPLOYMENT`` (uni-agent's variable), then the config file's (``agent_config.yaml``'s
``sandbox.backend``), then the default (``local``). Every command and library entry point that
picks a backend calls it, so they cannot disagree.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
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
    "kubernetes": "sandlot.sandboxes.kubernetes:KubernetesSandbox",
}
_registered: dict[str, type[Sandbox]] = {}

log = logging.getLogger(__name__)


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


# How a choice names its source when the caller does not name its own argument, and the default.
_GIVEN = "the argument"
_DEFAULT = "the default"


@dataclass(frozen=True)
class BackendChoice:
    """A run's backend and where it was chosen (``"--backend"``, ``"$SANDLOT_BACKEND"``,
    ``"$DEPLOYMENT"``, a config file's key, ``"the default"``)."""

    name: str
    source: str

    @property
    def defaulted(self) -> bool:
        """No argument, variable or config file named it."""
        return self.source == _DEFAULT

    def __str__(self) -> str:
        return f"backend: {self.name} (from {self.source})"


_said: set[BackendChoice] = set()


def choose_backend(
    given: str | None = None,
    *,
    given_by: str = _GIVEN,
    config: str | None = None,
    config_by: str = "agent_config.yaml's sandbox.backend",
    default: str = DEFAULT_BACKEND,
    say: Callable[[str], object] | None = None,
) -> BackendChoice:
    """The backend of a run: the first of ``given``, ``$SANDLOT_BACKEND``, ``$DEPLOYMENT``,
    ``config`` and ``default`` that is set, stripped and lower-cased, and checked.

    The choice is said where the caller says it (``say``: a command's stderr, once at its
    start); without ``say``, a choice this function made (not ``given``) is logged at INFO
    level the first time this process makes it, so a training worker that opens a sandbox per
    episode says it once.

    Args:
        given: the caller's name (``--backend``, ``backend=``); ``None`` or empty when unset.
        given_by: how the caller names ``given`` in messages (``"--backend"``).
        config: the config file's name, ``None`` when the file sets none.
        config_by: how messages name the config file's key.
        default: the last resort: ``local`` (``sandlot data prepare``: ``docker``).
        say: called with ``str(choice)`` (``"backend: modal (from $DEPLOYMENT)"``).

    Raises:
        BackendNotFoundError: the chosen name is no registered backend; the message says
            where it was set, lists the registered backends and says how to fix it.
    """
    # settings() is read only when no name is given: get_backend(name) runs per sandbox.
    env = None if given and given.strip() else settings()
    order = [(given, given_by)]
    if env is not None:
        order += [(env.backend, "$SANDLOT_BACKEND"), (env.deployment, "$DEPLOYMENT")]
    order += [(config, config_by), (default, _DEFAULT)]
    value, source = next((v.strip().lower(), by) for v, by in order if v and v.strip())
    choice = BackendChoice(value, source)
    check_backend_name(value, None if source in (given_by, _DEFAULT) else source)
    if say is not None:
        say(str(choice))
    elif choice.source != given_by and choice not in _said:
        _said.add(choice)
        log.info("%s", choice)
    return choice


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
    """Return the ``Sandbox`` subclass for ``name`` (``None``: :func:`choose_backend`'s).

    Raises:
        BackendNotFoundError: no backend has that name; the message says where the name came
            from (``name``, ``$SANDLOT_BACKEND`` or ``$DEPLOYMENT``) and lists the known ones.
    """
    resolved = choose_backend(name).name
    if resolved in _registered:
        return _registered[resolved]
    target = _BUILTIN.get(resolved) or _entry_point_targets()[resolved]
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise BackendNotFoundError(f"backend {resolved!r} points at {target}, not a Sandbox class")
    return cls
