"""``DEPLOYMENT=local``: rows that run on the host from a directory of git mirrors, no image.

The mirror directory (``--repo-mirror`` or ``$SANDLOT_REPO_MIRROR``) holds one git repository per
source repository, named after its ``owner/name`` with ``/`` replaced by ``__``::

    $SANDLOT_REPO_MIRROR/astropy__astropy        # git clone --mirror https://github.com/astropy/astropy
    $SANDLOT_REPO_MIRROR/sandlot-examples__minicalc

A local row has image ``"host"`` and ``repo_source`` = the absolute path of its mirror; the
``local`` backend uploads it, clones it into ``workdir`` and checks out ``base_commit``
(``sandlot.datasets.sandbox_setup.prepare_repo``), then runs the row's ``post_setup_cmd``, which
holds the dataset's install commands. Those run inside the bubblewrap jail, without network,
on the row's test environment: its ``environment`` recipe (SWE-rebench rows carry the
``python`` and ``pip_packages`` of their ``install_config``; SWE-bench rows get swebench's spec
for ``repo`` + ``version``), built once as a cached virtualenv and mounted read-only. ``pip
install`` there lands in the sandbox's private overlay, so an install must work offline (the
datasets' ``pip install --no-build-isolation --no-deps --no-index -e .`` does).
"""

from __future__ import annotations

import os
from pathlib import Path

from sandlot.datasets.errors import DatasetMessageError
from sandlot.datasets.repo_sources import mirror_dir_name, mirror_entry
from sandlot.settings import settings

REPO_MIRROR_ENV = "SANDLOT_REPO_MIRROR"


class LocalRowError(DatasetMessageError):
    """A local row cannot be built (no mirror directory given)."""


def resolve_mirror(value: str | os.PathLike[str] | None) -> Path:
    """The mirror directory: ``value``, else ``$SANDLOT_REPO_MIRROR``, made absolute.

    Raises:
        LocalRowError: neither is set.
    """
    raw = value if value is not None else settings().repo_mirror
    if not raw:
        raise LocalRowError(
            f"DEPLOYMENT=local needs a directory of git mirrors: set {REPO_MIRROR_ENV} or pass "
            "--repo-mirror (it holds one repository per repo, named <owner>__<name> or, as git "
            "clone --mirror names it, <owner>__<name>.git)"
        )
    return Path(raw).expanduser().absolute()


def mirror_source(mirror: Path, repo: str) -> str:
    """The ``repo_source`` of ``repo`` in ``mirror``: the repository found there
    (``owner__name`` or ``git clone --mirror``'s ``owner__name.git``), else ``owner__name``
    (the path need not exist yet)."""
    found = mirror_entry(mirror, repo)
    return str(found if found is not None else mirror / mirror_dir_name(repo))
