#!/usr/bin/env python3
"""Materialise the swe-mini example projects as git repositories with stable commit SHAs.

Usage: ``python examples/swe-mini/make_repos.py [--dest DIR] [--force]``

For every ``projects/<name>/`` next to this script, builds ``DEST/<name>`` (default
``repos/<name>`` next to this script) on branch ``main``:

1. the first commit holds the files of ``projects/<name>/``;
2. then one commit per ``history/<name>/*.patch`` file, in name order; each patch file starts with
   a ``Subject: <commit message>`` line followed by a ``git diff``.

The commits are reproducible across machines and git versions: user and system git configuration
are ignored, author/committer name, email and dates are fixed, signing is off, every file is
committed as ``100644`` with LF line endings, and build litter (``__pycache__``, ``*.pyc``) is
skipped. The script then checks that every ``base_commit`` of ``instances.jsonl`` is one of the
commits built for the project its ``repo_source`` (``repos/<name>``) names, and exits non-zero
otherwise.

Re-running is cheap: the repositories are rebuilt in a scratch directory (a few git commands
each) and an existing ``DEST/<name>`` whose ``HEAD`` already is the built tip and whose working
tree is clean is left untouched. An outdated repository is replaced; one with uncommitted changes
is only replaced with ``--force``. Needs Python >= 3.10 and git >= 2.28 (``git init -b``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECTS = HERE / "projects"
HISTORY = HERE / "history"
INSTANCES = HERE / "instances.jsonl"

AUTHOR_NAME = "Sandlot Examples"
AUTHOR_EMAIL = "examples@sandlot.invalid"
INITIAL_MESSAGE = "Initial commit"
SKIPPED_NAMES = {"__pycache__", ".pytest_cache", ".git", ".DS_Store"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")
GIT_OPTIONS = (
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.fileMode=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "i18n.commitEncoding=UTF-8",
    "-c",
    f"core.hooksPath={os.devnull}",
)


class BuildError(Exception):
    """A repository could not be built or does not match instances.jsonl."""


def git_env() -> dict[str, str]:
    """Environment for git: no user/system config, no inherited ``GIT_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        LC_ALL="C",
    )
    return env


def git(
    repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> str:
    """Run ``git <args>`` in ``repo``; return its stdout, raise :class:`BuildError` on failure."""
    result = subprocess.run(
        ["git", *GIT_OPTIONS, *args],
        cwd=repo,
        input=stdin,
        capture_output=True,
        env=env or git_env(),
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(
            f"git {' '.join(args)} failed in {repo} (exit {result.returncode}):\n"
            + result.stderr.decode(errors="replace")
        )
    return result.stdout.decode()


def commit(repo: Path, message: str, index: int) -> str:
    """Commit the whole working tree with the fixed identity and the date of commit ``index``."""
    date = f"2024-01-{index + 1:02d}T12:00:00+00:00"
    env = {**git_env(), "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    git(repo, "add", "--all", env=env)
    git(repo, "commit", "--quiet", "--no-verify", "-m", message, env=env)
    return git(repo, "rev-parse", "HEAD").strip()


def copy_sources(source: Path, repo: Path) -> None:
    """Copy ``source`` into ``repo`` as regular ``0644`` files with LF line endings."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if SKIPPED_NAMES.intersection(relative.parts) or path.suffix in SKIPPED_SUFFIXES:
            continue
        if path.is_dir():
            continue
        target = repo / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))
        target.chmod(0o644)


def read_patch(patch: Path) -> tuple[str, bytes]:
    """Return the commit message (the ``Subject:`` line) and the diff of a history patch file."""
    data = patch.read_bytes().replace(b"\r\n", b"\n")
    first, _, diff = data.partition(b"\n")
    subject = first.decode()
    if not subject.startswith("Subject: "):
        raise BuildError(f"{patch}: the first line must be 'Subject: <commit message>'")
    return subject.removeprefix("Subject: "), diff


def build_project(name: str, repo: Path) -> list[str]:
    """Create the git repository of project ``name`` at ``repo`` (must not exist).

    Returns:
        The commit SHAs, oldest first.
    """
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "-b", "main")
    copy_sources(PROJECTS / name, repo)
    shas = [commit(repo, INITIAL_MESSAGE, 0)]
    for index, patch in enumerate(sorted((HISTORY / name).glob("*.patch")), start=1):
        message, diff = read_patch(patch)
        git(repo, "apply", "--whitespace=nowarn", "-", stdin=diff)
        shas.append(commit(repo, message, index))
    return shas


def expected_commits(instances: Path) -> dict[str, set[str]]:
    """Map project name -> the ``base_commit`` values ``instances.jsonl`` pins in it."""
    wanted: dict[str, set[str]] = {}
    with instances.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            source = Path(record["repo_source"])
            if source.parent != Path("repos"):
                raise BuildError(
                    f"{instances}, line {number}: repo_source {str(source)!r} is not repos/<name>"
                )
            wanted.setdefault(source.name, set()).add(record["base_commit"])
    return wanted


def is_current(repo: Path, tip: str, *, force: bool) -> bool:
    """Whether ``repo`` already is the built repository; raise if replacing it loses work."""
    if not (repo / ".git").is_dir():
        if repo.exists():
            raise BuildError(f"{repo} exists but is not a git repository; remove it first")
        return False
    dirty = git(repo, "status", "--porcelain", "--untracked-files=all").strip()
    if dirty and not force:
        raise BuildError(f"{repo} has uncommitted changes; rerun with --force to replace it")
    head = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=git_env(),
        check=False,
    ).stdout.strip()
    return head == tip and not dirty


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest", type=Path, default=HERE / "repos", help="where to create <name>/ repositories"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace repositories with local changes"
    )
    args = parser.parse_args(argv)
    dest: Path = args.dest.resolve()
    projects = sorted(p.name for p in PROJECTS.iterdir() if p.is_dir())
    try:
        wanted = expected_commits(INSTANCES)
        unknown = sorted(set(wanted) - set(projects))
        if unknown:
            raise BuildError(f"instances.jsonl names unknown projects: {unknown}")
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=dest) as scratch:
            # Build and check everything before touching DEST, so a failure installs nothing.
            built = {name: build_project(name, Path(scratch) / name) for name in projects}
            for name, shas in built.items():
                missing = sorted(wanted.get(name, set()) - set(shas))
                if missing:
                    raise BuildError(
                        f"{name}: instances.jsonl pins commits {missing} but the build produced "
                        f"{shas}; the sources under projects/ or history/ no longer match "
                        f"instances.jsonl"
                    )
            current = {
                name: is_current(dest / name, shas[-1], force=args.force)
                for name, shas in built.items()
            }
            for name, shas in built.items():
                final = dest / name
                if current[name]:
                    print(f"{name}: up to date ({shas[-1][:12]})")
                    continue
                if final.exists():
                    shutil.rmtree(final)
                (Path(scratch) / name).rename(final)
                print(f"{name}: built {len(shas)} commit(s) at {final} ({shas[-1][:12]})")
    except BuildError as exc:
        print(f"make_repos: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
