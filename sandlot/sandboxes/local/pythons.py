"""Find a base interpreter of a given Python version on this machine, as ``uv`` would.

The ``local`` backend cannot download an interpreter into a sandbox: an environment recipe's
``python`` (``"3.9"``) must exist on the machine. :func:`find_interpreter` looks, in order, at

1. the interpreter sandlot runs on, when its version matches;
2. every ``python3.9`` on ``PATH``, in ``PATH`` order (not only the first: a pyenv shim for a
   version that is installed but not selected exits 127, ``pyenv: python3.9: command not
   found``, and hides the real interpreters behind it);
3. ``uv python find 3.9`` (uv's managed interpreters, where ``uv python install 3.9`` puts one,
   and the search path), run with the ``PATH`` entries that failed in step 2 removed, because
   uv stops at the first interpreter it cannot query;
4. pyenv's own installs, ``$PYENV_ROOT/versions/3.9.*/bin/python3.9`` (``$PYENV_ROOT``, else
   ``pyenv root``, else ``~/.pyenv``), newest patch release first: they exist whether or not
   pyenv selects them, and the shims of step 2 point at them.

A candidate is used only if it runs and reports the wanted version; one that does not run is
skipped with a warning naming it and what it printed. With none, the error says to install
the version (``uv python install 3.9``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from sandlot.errors import EnvironmentBuildError

log = logging.getLogger("sandlot.sandboxes.local.pythons")

_PROBE_TIMEOUT_S = 60
# Candidates already reported as broken: one warning per process, not one per environment.
_warned: set[str] = set()
_PATCH = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def default_interpreter() -> str:
    """The base interpreter behind the one sandlot runs on (never a virtualenv's ``python``:
    its packages must not leak into an environment)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


class _BrokenInterpreter(Exception):
    pass


def version_of(interpreter: str) -> str:
    """The full version (``"3.9.18"``) ``interpreter`` reports.

    Raises:
        EnvironmentBuildError: it does not run or prints no version (the message has its
            output).
    """
    try:
        return _probe(interpreter)
    except _BrokenInterpreter as exc:
        raise EnvironmentBuildError(f"cannot run the interpreter {interpreter}: {exc}") from None


def _probe(interpreter: str) -> str:
    try:
        done = subprocess.run(
            [interpreter, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise _BrokenInterpreter(str(exc)) from None
    version = done.stdout.strip()
    if done.returncode != 0 or not _PATCH.match(version):
        said = (done.stderr or done.stdout).strip().splitlines()
        raise _BrokenInterpreter(f"exit {done.returncode}: {said[0] if said else 'no output'}")
    return version


def find_interpreter(python: str | None) -> tuple[str, str]:
    """The base interpreter for ``python`` (a version like ``"3.11"``) and its full version.

    Args:
        python: ``"3"``, ``"3.9"`` or ``"3.9.18"``; ``None`` for the interpreter sandlot runs
            on. Searched as the module docstring says.

    Returns:
        ``(real path of the interpreter, "3.9.18")``.

    Raises:
        EnvironmentBuildError: no interpreter of that version runs on this machine; the
            message says how to install one (``uv python install 3.9``).
    """
    default = default_interpreter()
    if python is None:
        return default, version_of(default)
    wanted = python.split(".")
    current = [str(v) for v in sys.version_info[:3]]
    if current[: len(wanted)] == wanted:
        return default, version_of(default)
    broken_dirs: list[str] = []
    seen: set[str] = set()
    for candidate in _candidates(python, broken_dirs):
        real = os.path.realpath(candidate)
        if real in seen:
            continue
        seen.add(real)
        try:
            version = _probe(candidate)
        except _BrokenInterpreter as exc:
            if candidate not in _warned:
                _warned.add(candidate)
                log.warning("skipping %s, which does not run (%s)", candidate, exc)
            broken_dirs.append(os.path.dirname(candidate))
            continue
        if version.split(".")[: len(wanted)] == wanted:
            return real, version
    raise EnvironmentBuildError(
        f"the environment asks for Python {python}, but no python{python} runs on this machine "
        f"(sandlot runs on {'.'.join(current)}). Install it: `uv python install {python}` (or "
        "pyenv, or your package manager); the local backend cannot switch interpreters without "
        "one. Or drop `python` from the recipe, or use a container backend whose image has it"
    )


def _candidates(python: str, broken_dirs: list[str]) -> Iterator[str]:
    """Interpreters to try, in the order of the module docstring; ``broken_dirs`` fills up with
    the ``PATH`` directories whose candidate failed while the caller tries them."""
    name = f"python{python}"
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which(name, path=entry) if entry else None
        if found:
            yield found
    found_by_uv = _uv_find(python, broken_dirs)
    if found_by_uv:
        yield found_by_uv
    yield from _pyenv_installs(python)


def _uv_find(python: str, broken_dirs: list[str]) -> str | None:
    uv = find_uv()
    if uv is None:
        return None
    path = [e for e in os.environ.get("PATH", "").split(os.pathsep) if e not in broken_dirs]
    try:
        found = subprocess.run(
            [uv, "python", "find", "--no-project", python],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            env={**os.environ, "PATH": os.pathsep.join(path)},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("`uv python find %s` did not run: %s", python, exc)
        return None
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else None


def _pyenv_installs(python: str) -> list[str]:
    root = _pyenv_root()
    if root is None or not (root / "versions").is_dir():
        return []
    major_minor = ".".join(python.split(".")[:2])
    installs = []
    for version_dir in (root / "versions").iterdir():
        match = _PATCH.match(version_dir.name)
        # Only plain CPython releases ("3.9.18"), not "3.9.18/envs/x" or "pypy3.9-7.3".
        if not match or version_dir.name != match.group(0):
            continue
        if not (version_dir.name + ".").startswith(python + "."):
            continue
        exe = version_dir / "bin" / f"python{major_minor}"
        if exe.is_file():
            installs.append((tuple(int(g) for g in match.groups()), str(exe)))
    return [exe for _, exe in sorted(installs, reverse=True)]


def _pyenv_root() -> Path | None:
    configured = os.environ.get("PYENV_ROOT")
    if configured:
        return Path(configured).expanduser()
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            done = subprocess.run(
                [pyenv, "root"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
            )
            if done.returncode == 0 and done.stdout.strip():
                return Path(done.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return Path.home() / ".pyenv"


def find_uv() -> str | None:
    """The ``uv`` binary: the PyPI package ``uv``'s, else one on ``PATH``; ``None`` if none."""
    try:
        from uv import find_uv_bin  # the PyPI package `uv` ships the binary
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")
