"""Where each instance's repository comes from, settled before a run starts.

An instance gets its repository (in this order) from its own ``repo_source`` (a git URL, or a
host path to a repository or bare mirror), from a directory of bare mirrors (``--repo-mirror
DIR`` or ``$SANDLOT_REPO_MIRROR``), or from its image. A mirror directory holds one repository
per ``owner/name``, named as ``git clone --mirror`` names it or without the suffix::

    DIR/pallets__flask.git      # git clone --mirror https://github.com/pallets/flask
    DIR/pytest-dev__pytest      # or a symlink to a mirror kept elsewhere

Host paths are resolved to their real path here (symlinks followed), because a sandbox upload
copies a symlink as a link, which does not exist inside the sandbox.

The only image known not to hold the repository is ``"host"`` (the ``local`` backend's view of
this machine); a container image is trusted to hold it at ``workdir``, as SWE-bench's images do.
An instance on ``"host"`` with no source is refused before any sandbox opens
(:class:`MissingRepoSourceError`), instead of failing each evaluation after set-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sandlot.datasets.images import LOCAL_IMAGE
from sandlot.datasets.instance import Instance, is_remote_source
from sandlot.errors import SandlotError

MIRROR_SUFFIX = ".git"
_SHOWN = 5  # instance ids named in an error, the rest are counted


class MissingRepoSourceError(SandlotError, ValueError):
    """Instances have no repository to evaluate on; the message names them and the fix."""


def mirror_dir_name(repo: str) -> str:
    """``"owner/name"`` -> ``"owner__name"``, a repository's name in a mirror directory."""
    return repo.replace("/", "__")


def mirror_entry(mirror_dir: str | os.PathLike[str], repo: str) -> Path | None:
    """The entry of ``repo`` in ``mirror_dir`` as it is named there, or ``None``.

    Args:
        mirror_dir: a directory of repositories.
        repo: ``"owner/name"``.

    Returns:
        ``mirror_dir/owner__name`` or, failing that, ``mirror_dir/owner__name.git``
        (``git clone --mirror``'s name), whichever is a directory (a symlink to one counts);
        ``None`` when neither is (or ``repo`` is empty).
    """
    if not repo:
        return None
    base = Path(mirror_dir) / mirror_dir_name(repo)
    for candidate in (base, base.with_name(base.name + MIRROR_SUFFIX)):
        if candidate.is_dir():
            return candidate
    return None


def find_mirror(mirror_dir: str | os.PathLike[str], repo: str) -> Path | None:
    """:func:`mirror_entry` resolved to its real path (symlinks followed), or ``None``."""
    entry = mirror_entry(mirror_dir, repo)
    return Path(os.path.realpath(entry)) if entry is not None else None


def with_repo_sources(
    instances: Sequence[Instance],
    *,
    backend: str,
    mirror_dir: str | os.PathLike[str] | None = None,
) -> list[Instance]:
    """``instances`` with their repository sources settled for a run on ``backend``.

    A host-path ``repo_source`` that exists becomes its real path; one that does not exist, or
    a missing ``repo_source``, is replaced by the instance's mirror in ``mirror_dir`` when there
    is one. URLs are kept as they are.

    Args:
        instances: the instances to run (their ``image`` already chosen, e.g. by ``--image``).
        backend: the backend name the run uses (selects each instance's image).
        mirror_dir: a directory of bare mirrors (``owner__name`` or ``owner__name.git``), or
            ``None``.

    Returns:
        New instances (copies where something changed), in order.

    Raises:
        MissingRepoSourceError: an instance's ``repo_source`` path does not exist and no mirror
            replaces it, or an instance on image ``"host"`` has no source at all. The message
            names the first few instances, counts them, and gives the fix.
    """
    out: list[Instance] = []
    missing: list[Instance] = []
    broken: list[Instance] = []
    for inst in instances:
        source = inst.repo_source
        if source and is_remote_source(source):
            out.append(inst)
            continue
        if source and Path(source).expanduser().exists():
            real = os.path.realpath(Path(source).expanduser())
            out.append(inst if real == source else inst.model_copy(update={"repo_source": real}))
            continue
        mirror = find_mirror(mirror_dir, inst.repo) if mirror_dir is not None else None
        if mirror is not None:
            out.append(inst.model_copy(update={"repo_source": str(mirror)}))
        elif source:
            broken.append(inst)
        elif inst.image_for(backend) == LOCAL_IMAGE:
            missing.append(inst)
        else:
            out.append(inst)  # the image holds the repository
    if broken:
        first = broken[0]
        raise MissingRepoSourceError(
            f"repo_source does not exist for {_named(broken)}, e.g. {first.repo_source} of "
            f"{first.instance_id}; fix the rows' repo_source, or pass --repo-mirror DIR, a "
            f"directory holding {_mirror_names(broken)}"
        )
    if missing:
        where = (
            f"--repo-mirror {mirror_dir} has no {_mirror_names(missing)}"
            if mirror_dir is not None
            else "no repo_source and no --repo-mirror"
        )
        raise MissingRepoSourceError(
            f"no repository for {_named(missing)} on image {LOCAL_IMAGE!r} ({where}); pass "
            f"--repo-mirror DIR, a directory of bare mirrors named <owner>__<name>[.git] "
            f"(git clone --mirror), or give each row a repo_source"
        )
    return out


def _named(instances: Sequence[Instance]) -> str:
    ids = [i.instance_id for i in instances]
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return f"{len(ids)} instance(s) ({', '.join(ids[:_SHOWN])}{more})"


def _mirror_names(instances: Sequence[Instance]) -> str:
    names = sorted({mirror_dir_name(i.repo) for i in instances if i.repo})
    if not names:
        return "a mirror per repo (the rows have no repo)"
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f"{', '.join(n + '[.git]' for n in names[:_SHOWN])}{more}"
