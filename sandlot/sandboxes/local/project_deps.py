"""What a repository's install would download, installed into its environment beforehand.

On ``local`` the repository's ``install`` (``python -m pip install -e .``) runs inside the jail,
without network. SWE-bench runs it with network: pip downloads the build backends into an
isolated build environment, then whatever the project's dependencies (extras included) add to
the environment. :func:`install_project_dependencies` does both while the environment is built
on the host, where the network is allowed, from a checkout of the project's commit, after the
recipe's repository edits (``ProjectSource.edits``, its ``pre_install``):

1. the build backends: ``[build-system] requires`` of its ``pyproject.toml`` (PEP 518), or
   ``setuptools`` and ``wheel`` without one (pip's own default); already installed versions
   that satisfy them are kept;
2. what ``pip install --dry-run --report`` of the install target (``.`` or ``.[test]``) would
   install next to what the environment holds (pip's installation report, ``--report``,
   pip >= 22.2: https://pip.pypa.io/en/stable/reference/installation-report/), each pinned
   to the version pip chose and installed without resolving again (``--no-deps``). The dry
   run builds the project's metadata without build isolation, as the install in the jail
   will: a build backend missing here fails here, with its message, not in the jail.

The environment's ``pip.conf`` (:mod:`sandlot.sandboxes.local.venv`) then turns build
isolation off for the install in the jail.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandlot.errors import EnvironmentBuildError
from sandlot.sandboxes.environment import ProjectSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger("sandlot.sandboxes.local.project_deps")

DEFAULT_BUILD_REQUIRES = ("setuptools", "wheel")
"""pip's build requirements for a project without ``[build-system]`` (PEP 518's fallback)."""

Install = Callable[[list[str], str], None]
Run = Callable[[list[str], str], None]


def build_requires(checkout: Path) -> list[str]:
    """``[build-system] requires`` of ``checkout/pyproject.toml``, else setuptools and wheel.

    Raises:
        EnvironmentBuildError: the file is not valid TOML, or ``requires`` is not a list of
            strings.
    """
    pyproject = checkout / "pyproject.toml"
    if not pyproject.is_file():
        return list(DEFAULT_BUILD_REQUIRES)
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EnvironmentBuildError(f"the project's pyproject.toml does not parse: {exc}") from None
    system = data.get("build-system")
    if not isinstance(system, dict) or "requires" not in system:
        return list(DEFAULT_BUILD_REQUIRES)
    requires = system["requires"]
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise EnvironmentBuildError(
            f"the project's pyproject.toml has [build-system] requires = {requires!r}, "
            "not a list of requirement strings"
        )
    return requires


def planned_installs(report: dict[str, Any]) -> list[str]:
    """The requirements pip's installation report plans, the project itself left out.

    Args:
        report: pip's ``--report`` JSON (``{"install": [{"metadata": {"name", "version"},
            "download_info": {"url", ...}, "is_direct": bool}, ...]}``).

    Returns:
        ``"name==version"`` for what comes from an index, ``"name @ url"`` for a direct
        reference (a VCS or archive URL a dependency names); a local directory (the project)
        is left out.
    """
    found = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        info = item.get("download_info", {})
        if not item.get("is_direct"):
            found.append(f"{name}=={version}")
        elif "dir_info" not in info:
            found.append(f"{name} @ {info['url']}")
    return found


def install_project_dependencies(
    project: ProjectSource, python: str, install: Install, run: Run
) -> None:
    """Install ``project``'s build backends and dependencies into the environment of ``python``.

    Args:
        project: the repository (a git directory on this machine), commit and install target.
        python: the environment's ``bin/python``.
        install: ``install(args, what)`` runs the environment's installer with ``args``.
        run: ``run(argv, what)`` runs a command, raising :class:`EnvironmentBuildError` with its
            output when it fails.

    Raises:
        EnvironmentBuildError: the repository or commit is missing, a build backend or a
            dependency cannot be installed, or the project's metadata cannot be built.
    """
    if not Path(project.source).exists():
        raise EnvironmentBuildError(
            f"the repository {project.source} (whose dependencies the environment installs) "
            "does not exist on this machine"
        )
    with tempfile.TemporaryDirectory(prefix="sandlot-project-") as tmp:
        checkout = Path(tmp, "repo")
        run(
            ["git", "clone", "--quiet", "--shared", "--no-checkout", project.source, str(checkout)],
            f"cloning {project.source}",
        )
        run(
            ["git", "-C", str(checkout), "checkout", "--quiet", "--detach", project.commit],
            f"checking out {project.commit} of {project.source}",
        )
        for command in project.edits:
            run(
                ["bash", "-c", 'cd -- "$0" && eval "$1"', str(checkout), command],
                f"running {command!r} in the checkout",
            )
        install(build_requires(checkout), "installing the project's build backends")
        if not _has_report(python):
            log.warning(
                "the environment's pip is older than 22.2 (no --report): the dependencies of "
                "%s are not installed ahead; its install runs offline and fails if one is missing",
                project.target,
            )
            return
        report = Path(tmp, "report.json")
        target = str(checkout) + project.target.removeprefix(".")
        run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--no-build-isolation",
                "--report",
                str(report),
                target,
            ],
            f"resolving the dependencies of {project.target} at {project.commit[:12]}",
        )
        planned = planned_installs(json.loads(report.read_text()))
        if planned:
            install(["--no-deps", *planned], "installing the project's dependencies")


def _has_report(python: str) -> bool:
    done = subprocess.run(
        [python, "-m", "pip", "install", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return "--report" in done.stdout
