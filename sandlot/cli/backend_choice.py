"""The backend a command runs on (:func:`~sandlot.sandboxes.registry.choose_backend`'s order:
``--backend``, ``$SANDLOT_BACKEND``, ``$DEPLOYMENT``, the config file, ``local``), checked before
any work with an error that names where it was set, and said on stderr."""

from __future__ import annotations

import click

from sandlot.cli.exit_codes import InputError
from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.registry import choose_backend


def chosen_backend(
    backend: str | None, config: str | None = None, config_by: str = "the config"
) -> str:
    """The backend name (stripped, lower case) of a command, checked, and said on stderr
    (``backend: modal (from $DEPLOYMENT)``).

    Args:
        backend: the ``--backend`` value, ``None`` when not given.
        config: the config file's name (already checked), ``None`` when it sets none.
        config_by: how messages name the config file's key (``agent.yaml's sandbox.backend``).

    Raises:
        click.BadParameter: ``--backend`` names no backend (lists the known ones).
        InputError: ``$SANDLOT_BACKEND`` or ``$DEPLOYMENT`` names no backend (says
            which variable, lists the known ones and the fix).
    """
    try:
        choice = choose_backend(
            backend,
            given_by="--backend",
            config=config,
            config_by=config_by,
            say=lambda line: click.echo(line, err=True),
        )
    except BackendNotFoundError as exc:
        if backend:
            raise click.BadParameter(str(exc), param_hint="--backend") from None
        raise InputError(str(exc)) from None  # exit 2, as a bad --backend
    return choice.name
