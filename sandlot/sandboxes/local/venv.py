"""Cached virtual environments of the ``local`` backend: one per recipe and interpreter.

An :class:`~sandlot.sandboxes.environment.EnvironmentRecipe` with packages becomes a virtual
environment under ``<cache>/envs/<key>``, where ``<cache>`` is ``$SANDLOT_ENV_CACHE`` or the
user cache directory (``platformdirs.user_cache_dir("sandlot")``, ``~/.cache/sandlot`` on
Linux) and ``<key>`` is a hash of the packages, the interpreter's path and its version. It is
built with ``uv`` (the PyPI package ``uv``, or a ``uv`` on ``PATH``) when present, else with
``python -m venv`` and pip; ``$SANDLOT_ENV_INSTALLER`` (``uv`` or ``pip``) forces one. Either
compiles what it installs to bytecode (the environment is read-only in a jail). The
interpreter is found as :mod:`sandlot.sandboxes.local.pythons` says.

A build installs in SWE-bench's order (``swebench.harness.test_spec.python.
make_env_script_list_py``), one installer call per step: the recipe's ``requirements``, then
its ``pip_packages``, then, for a recipe with a ``project``, the project's build backends and
the dependencies its install would download (:mod:`sandlot.sandboxes.local.project_deps`).
Last it writes ``pip.conf`` (:data:`PIP_CONF`) into the environment, which turns pip's build
isolation off: the repository's install runs in the jail without network and builds with the
backends the environment holds.

Builds hold a file lock per key (``filelock``), so concurrent sandboxes and processes build an
environment once and the others wait for it. An environment is complete only once its marker
file :data:`MARKER` exists, written last; a directory without it (a build that failed, was
interrupted or killed) is deleted and rebuilt, never used. A failed build leaves nothing behind.

Inside a jail the environment is read-only. Its site-packages holds :data:`OVERLAY_PTH`, which
adds the site-packages under ``$SANDLOT_ENV_OVERLAY`` when that variable is set: the sandbox
points it (and ``PIP_PREFIX``) at a private writable directory, so ``pip install -e .`` in a
sandbox installs there, on top of the shared environment, without touching it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandlot.errors import EnvironmentBuildError
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.local.hostdirs import remove_tree
from sandlot.sandboxes.local.project_deps import install_project_dependencies
from sandlot.sandboxes.local.pythons import find_interpreter, find_uv
from sandlot.settings import settings

log = logging.getLogger("sandlot.sandboxes.local.venv")

CACHE_ENV = "SANDLOT_ENV_CACHE"
INSTALLER_ENV = "SANDLOT_ENV_INSTALLER"
OVERLAY_ENV = "SANDLOT_ENV_OVERLAY"
MARKER = "sandlot-env.json"
OVERLAY_PTH = "_sandlot_overlay.pth"
PIP_CONF = "pip.conf"
BUILD_TIMEOUT_S = 1800.0
_TAIL_LINES = 25

# One line: site.py executes .pth lines that start with "import".
_OVERLAY_LINE = (
    "import os, site, sysconfig; p = os.environ.get('SANDLOT_ENV_OVERLAY'); "
    "p and site.addsitedir(sysconfig.get_path('purelib', vars={'base': p, 'platbase': p}))\n"
)

# pip reads <sys.prefix>/pip.conf as its "site" configuration. The repository's install runs in
# the jail without network, so pip must not build in an isolated environment (which downloads
# the build backends): the build backends are in the environment already. The value is
# inverted: pip stores it in `build_isolation`, so "false" turns isolation off (pip's
# documented quirk of negative options, as PIP_NO_BUILD_ISOLATION=0).
# An editable install is a path entry in a .pth file, as swebench's images have it (their pip
# ran `setup.py develop`): setuptools' PEP 660 default instead installs an import finder, and
# code that maps files to modules through sys.path (astroid, so pylint's checkers) finds
# nothing. `editable_mode=compat` is setuptools' documented switch; other backends ignore it.
_PIP_CONF_TEXT = """\
# Written by sandlot: the repository's install runs offline, with this environment's build
# backends (see sandlot/sandboxes/local/venv.py).
[global]
no-build-isolation = false

[install]
config-settings = editable_mode=compat
"""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuiltEnvironment:
    """A complete cached environment.

    Attributes:
        path: its directory (``bin/python`` inside).
        key: its cache key.
        recipe: the recipe it was built from (packages only).
        interpreter: the base interpreter it was created from.
    """

    path: Path
    key: str
    recipe: EnvironmentRecipe
    interpreter: str

    @property
    def bin_dir(self) -> Path:
        """``<path>/bin``, put first on ``PATH``."""
        return self.path / "bin"


def cache_dir() -> Path:
    """``$SANDLOT_ENV_CACHE``, else ``<user cache dir>/envs`` (``~/.cache/sandlot/envs``)."""
    configured = settings().env_cache
    if configured:
        return Path(configured).expanduser().absolute()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sandlot")) / "envs"


def _installer() -> str:
    forced = (settings().env_installer or "").strip().lower()
    if forced not in ("", "uv", "pip"):
        raise EnvironmentBuildError(f"{INSTALLER_ENV} must be 'uv' or 'pip', got {forced!r}")
    if forced == "pip":
        return "pip"
    uv = find_uv()
    if uv is None and forced == "uv":
        raise EnvironmentBuildError(f"{INSTALLER_ENV}=uv but uv is not installed (pip install uv)")
    return uv or "pip"


# Bumped when what a build makes for the same recipe changes (2: pip.conf, ordered installs;
# 3: editable installs as path entries; 4: uv compiles the bytecode, as pip does).
_LAYOUT = "layout-4"


def environment_key(recipe: EnvironmentRecipe, interpreter: str, version: str) -> str:
    """The cache key: packages (requirements lines, pip_packages, the project's commit and
    install target, which fix its build backends and dependencies), interpreter path and
    version, and the build layout."""
    return recipe.packages_only().digest(interpreter, version, _LAYOUT)


def is_complete(path: Path) -> bool:
    """``True`` when ``path`` is a finished environment (its marker exists)."""
    return (path / MARKER).is_file()


def ensure_environment(
    recipe: EnvironmentRecipe,
    *,
    root: Path | None = None,
    progress: Progress | None = None,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> BuiltEnvironment:
    """Return the cached environment of ``recipe``, building it first if needed.

    Blocking (run it in a worker thread from async code). Safe to call from many threads and
    processes at once: one builds, the others wait on the key's file lock.

    Args:
        recipe: what to install; its repository steps are ignored here.
        root: cache directory; ``None`` for :func:`cache_dir`.
        progress: called with one-line status messages while building.
        timeout_s: limit in seconds for one build (also for waiting on another's build).

    Raises:
        EnvironmentBuildError: the interpreter is missing, or the build failed or timed out;
            the message names the packages and ends with the installer's output tail.
    """
    from filelock import FileLock, Timeout

    root = root or cache_dir()
    interpreter, version = find_interpreter(recipe.python)
    key = environment_key(recipe, interpreter, version)
    path = root / key
    built = BuiltEnvironment(path, key, recipe.packages_only(), interpreter)
    if is_complete(path):
        _touch(path)
        return built
    root.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(root / f"{key}.lock"), timeout=timeout_s):
            if is_complete(path):
                return built  # another worker built it while we waited
            if os.path.lexists(path):
                log.warning("removing the unfinished environment %s (an interrupted build)", path)
                remove_tree(path)
            say = progress or (lambda _msg: None)
            say(f"building environment {key} ({recipe.describe()}); cached for later runs")
            log.info("building environment %s at %s: %s", key, path, recipe.describe())
            started = time.monotonic()
            try:
                _build(built, version, timeout_s)
            except BaseException:
                remove_tree(path)  # also on Ctrl-C: nothing half-built is ever reused
                raise
            say(f"environment {key} ready in {time.monotonic() - started:.1f} s")
    except Timeout as exc:
        raise EnvironmentBuildError(
            f"waited {timeout_s:g} s for another process to build environment {key} "
            f"({recipe.describe()}); remove {root / key}.lock if no build is running"
        ) from exc
    return built


def _run(argv: list[str], what: str, recipe: EnvironmentRecipe, timeout_s: float) -> None:
    try:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentBuildError(
            f"{what} for {recipe.describe()} did not finish within {timeout_s:g} s"
        ) from exc
    except OSError as exc:
        raise EnvironmentBuildError(f"{what} could not start: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stdout.rstrip().splitlines()[-_TAIL_LINES:])
        raise EnvironmentBuildError(
            f"{what} failed (exit {done.returncode}) for {recipe.describe()}:\n{tail}"
        )


def _build(env: BuiltEnvironment, version: str, timeout_s: float) -> None:
    recipe, path = env.recipe, env.path
    installer = _installer()
    python = str(path / "bin" / "python")
    # Never the host interpreter's own packages, whatever system_site_packages says: they are
    # not part of any image, and the caller's Python is never what a sandbox's tests run on.
    if installer == "pip":
        _run([env.interpreter, "-m", "venv", str(path)], "creating the virtualenv", recipe, 600)
    else:
        argv = [installer, "venv", "--quiet", "--seed", "--python", env.interpreter, str(path)]
        _run(argv, "creating the virtualenv (uv)", recipe, 600)

    def install(args: list[str], what: str) -> None:
        if installer == "pip":
            argv = [python, "-m", "pip", "install", "--quiet", *args]
        else:
            # --compile-bytecode: pip compiles by default, uv does not. The environment is
            # read-only in a jail (and its sandboxes set PYTHONDONTWRITEBYTECODE): without its
            # .pyc files every python started there compiles what it imports (pytest: ~1 s).
            argv = [installer, "pip", "install", "--quiet", "--compile-bytecode", "--python"]
            argv += [python, *args]
        _run(argv, what, recipe, timeout_s)

    # swebench's order (make_env_script_list_py): the requirements file, then pip_packages, in
    # separate installer calls: a pin of pip_packages replaces one of the requirements.
    if recipe.requirements:
        requirements = path / "sandlot-requirements.txt"
        requirements.write_text("\n".join(recipe.requirements) + "\n")
        install(["-r", str(requirements)], "installing the requirements")
    if recipe.pip_packages:
        install(list(recipe.pip_packages), "installing pip_packages")
    if recipe.project is not None:
        install_project_dependencies(
            recipe.project, python, install, lambda argv, what: _run(argv, what, recipe, timeout_s)
        )
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.strip()
    if not purelib:
        raise EnvironmentBuildError(f"the new environment's python at {python} does not run")
    Path(purelib, OVERLAY_PTH).write_text(_OVERLAY_LINE)
    (path / PIP_CONF).write_text(_PIP_CONF_TEXT)
    marker = {
        "key": env.key,
        "recipe": recipe.model_dump(),
        "interpreter": env.interpreter,
        "python_version": version,
        "installer": "pip" if installer == "pip" else "uv",
        "created_at": time.time(),
    }
    tmp = path / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2))
    tmp.rename(path / MARKER)  # last: the environment is complete from here on


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path / MARKER)  # "last used", for `sandlot env prune --older-than`


@dataclass(frozen=True)
class CachedEnvironment:
    """One entry of the cache, as ``sandlot env list`` shows it."""

    path: Path
    complete: bool
    info: dict[str, object]
    last_used: float
    size_bytes: int


def _size(path: Path) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def list_environments(root: Path | None = None) -> list[CachedEnvironment]:
    """Every environment directory in the cache, complete or not, oldest use first."""
    root = root or cache_dir()
    if not root.is_dir():
        return []
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        complete = is_complete(path)
        info: dict[str, object] = {}
        if complete:
            try:
                info = json.loads((path / MARKER).read_text())
            except (OSError, ValueError):
                complete = False
        stamp = (path / MARKER) if complete else path
        found.append(CachedEnvironment(path, complete, info, stamp.stat().st_mtime, _size(path)))
    return sorted(found, key=lambda e: e.last_used)


def prune_environments(
    *, root: Path | None = None, older_than_s: float | None = None, dry_run: bool = False
) -> list[CachedEnvironment]:
    """Delete unfinished environments, and complete ones unused for ``older_than_s`` seconds
    (all of them when ``None``). Environments being built (lock held) are left alone.

    Returns:
        What was (or, with ``dry_run``, would be) deleted.
    """
    from filelock import FileLock, Timeout

    root = root or cache_dir()
    now = time.time()
    removed = []
    for env in list_environments(root):
        if env.complete and older_than_s is not None and now - env.last_used < older_than_s:
            continue
        lock = FileLock(str(root / f"{env.path.name}.lock"), timeout=0)
        try:
            with lock:
                if not dry_run:
                    remove_tree(env.path)
        except Timeout:
            continue  # a build is running
        removed.append(env)
    return removed
