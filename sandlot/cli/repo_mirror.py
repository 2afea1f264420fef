"""``--repo-mirror DIR`` of ``sandlot eval`` and ``sandlot rollout``: where rows without a
repository source find theirs (:mod:`sandlot.datasets.repo_sources`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from sandlot.cli.exit_codes import InputError
from sandlot.datasets.instance import Instance
from sandlot.datasets.local import REPO_MIRROR_ENV
from sandlot.datasets.repo_sources import MissingRepoSourceError, with_repo_sources
from sandlot.settings import settings

repo_mirror_option = click.option(
    "--repo-mirror",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Directory of bare git mirrors, one per repo, named <owner>__<name> or "
    "<owner>__<name>.git (git clone --mirror; symlinks are followed): the repository of each "
    f"row without a repo_source (default: ${REPO_MIRROR_ENV}).",
)


def mirror_dir(value: Path | None) -> Path | None:
    """``--repo-mirror``, else ``$SANDLOT_REPO_MIRROR``, else ``None``.

    Raises:
        InputError: ``$SANDLOT_REPO_MIRROR`` names no directory.
    """
    if value is not None:
        return value
    raw = settings().repo_mirror
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise InputError(
            f"{REPO_MIRROR_ENV}={raw} is not a directory; point it at a directory of bare "
            "mirrors, or unset it"
        )
    return path


def settle_sources(
    instances: Sequence[Instance], *, backend: str, mirror: Path | None
) -> list[Instance]:
    """:func:`~sandlot.datasets.repo_sources.with_repo_sources` for a command.

    Raises:
        InputError: an instance has no repository source (one ``Error:`` line, exit 2).
    """
    try:
        return with_repo_sources(instances, backend=backend, mirror_dir=mirror)
    except MissingRepoSourceError as exc:
        raise InputError(str(exc)) from None
