"""A SWE-bench spec's requirements file, read from the repository on this machine.

swebench 4.1 installs the environment of a spec whose ``packages`` is ``"requirements.txt"``
from a file of the repository at the instance's ``environment_setup_commit``
(``swebench.harness.test_spec.python.get_requirements``): the first of
``MAP_REPO_TO_REQS_PATHS[repo]`` that exists, its ``-r`` includes (resolved next to it, one
level deep) placed before its own lines, lines starting with ``-e .``, ``#`` or ``.[test``
dropped, and ``clean_requirements`` applied (a package yanked from PyPI renamed). swebench
downloads these files from GitHub; :func:`read_requirements` reads the same paths with
``git show <commit>:<path>`` from a repository on this machine (a bare mirror or a clone) and
composes the same text, with swebench's constants and ``clean_requirements`` itself.
"""

from __future__ import annotations

import functools
import posixpath
import subprocess

from sandlot.datasets.errors import DatasetMessageError

# swebench's `exclude_line` (get_requirements_by_commit): lines of the repository's own install.
_EXCLUDED_PREFIXES = ("-e .", "#", ".[test")


class RequirementsError(DatasetMessageError):
    """The requirements file of a spec cannot be read from the repository."""


def _show(source: str, commit: str, path: str) -> str | None:
    """``git show commit:path`` in ``source``; ``None`` when the file is not in that commit."""
    try:
        done = subprocess.run(
            ["git", "-C", source, "show", f"{commit}:{path}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RequirementsError(f"cannot run git on {source}: {exc}") from None
    if done.returncode == 0:
        return done.stdout
    # Tell "no such file in that commit" apart from "no such commit/repository".
    probe = subprocess.run(
        ["git", "-C", source, "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        raise RequirementsError(
            f"commit {commit} is not in the repository {source} ({probe.stderr.strip()}); "
            "update the mirror (git -C <mirror> fetch --all) or point at a full clone"
        )
    return None


@functools.cache
def read_requirements(repo: str, source: str, commit: str) -> str:
    """The requirements text swebench 4.1 installs for ``repo`` at ``commit``.

    Args:
        repo: ``"owner/name"``, a key of swebench's ``MAP_REPO_TO_REQS_PATHS``.
        source: a git repository of ``repo`` on this machine.
        commit: the instance's ``environment_setup_commit`` (else its ``base_commit``).

    Returns:
        The text swebench writes to ``$HOME/requirements.txt`` (the includes' lines first).

    Raises:
        RequirementsError: ``repo`` has no requirements paths in swebench, ``commit`` is not
            in ``source``, or none of the paths exists there.
        ImportError: ``swebench`` is not installed.
    """
    from swebench.harness.constants import MAP_REPO_TO_REQS_PATHS
    from swebench.harness.test_spec.python import clean_requirements

    paths = MAP_REPO_TO_REQS_PATHS.get(repo)
    if not paths:
        raise RequirementsError(f"swebench names no requirements file for {repo!r}")
    for req_path in paths:
        text = _show(source, commit, req_path)
        if text is not None:
            break
    else:
        raise RequirementsError(
            f"none of swebench's requirements files for {repo} ({', '.join(paths)}) exists at "
            f"commit {commit} of {source}"
        )

    def excluded(line: str) -> bool:
        return line.strip().startswith(_EXCLUDED_PREFIXES)

    original: list[str] = []
    additional: list[str] = []
    req_dir = posixpath.dirname(req_path)
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            include = posixpath.normpath(posixpath.join(req_dir, line[len("-r") :].strip()))
            # swebench skips an include it cannot fetch; so does this.
            included = _show(source, commit, include)
            if included is not None:
                additional += [ln for ln in included.split("\n") if not excluded(ln)]
        elif not excluded(line):
            original.append(line)
    additional.append("\n".join(original))
    return str(clean_requirements("\n".join(additional)))
