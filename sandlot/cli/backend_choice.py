"""The backend a command runs on: ``--backend``, else ``$SANDLOT_BACKEND``, else ``$DEPLOYMENT``,
else the command's default, checked before any work with an error that names where it was set."""

from __future__ import annotations

import click

from sandlot.cli.exit_codes import InputError
from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.registry import backend_source, check_backend_name, resolve_backend_name


def chosen_backend(backend: str | None, default: str | None = None) -> str:
    """The backend name (stripped, lower case) of a command, checked.

    Args:
        backend: the ``--backend`` value, ``None`` when not given.
        default: the name when neither ``--backend`` nor the environment sets one (a config
            file's, already checked); ``None`` for the registry's default (``local``).

    Raises:
        click.BadParameter: ``--backend`` names no backend (lists the known ones).
        InputError: ``$SANDLOT_BACKEND`` or ``$DEPLOYMENT`` names no backend (says
            which variable, lists the known ones and the fix).
    """
    source = backend_source(backend)
    name = resolve_backend_name(backend or (None if source else default))
    try:
        check_backend_name(name, source)
    except BackendNotFoundError as exc:
        if source is None:
            raise click.BadParameter(str(exc), param_hint="--backend") from None
        raise InputError(str(exc)) from None  # exit 2, as a bad --backend
    return name
