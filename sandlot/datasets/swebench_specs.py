"""Test commands and log parsers taken from the ``swebench`` harness's per-repo specifications.

Pinned release: ``sandlot[eval]`` requires ``swebench>=4.1,<5``. 4.1.0 is the last release whose
``swebench.harness.constants`` exposes ``MAP_REPO_VERSION_TO_SPECS`` (repo → version → spec dict
with ``test_cmd``, ``install``, ...); 5.x removed the per-repo specifications from
``harness.constants``. Rows of 5.x datasets and task repositories carry their own eval script,
log parser and grading rule, read by :mod:`sandlot.datasets.swebench_tasks` with either release
installed (``sandlot[eval5]`` installs beside swebench 5.x).

How swebench 4.1.0 composes the command it runs between its test-output markers
(``swebench/harness/test_spec/``), which :func:`resolve_test_cmd` reproduces:

- Python repos (``MAP_REPO_TO_EXT[repo] == "py"``; ``python.make_eval_script_list_py``):
  ``" ".join([specs["test_cmd"], *get_test_directives(instance)])``; the spec's ``test_cmd`` is a
  string for every Python repo, and the directives are the files the ``test_patch`` touches
  (dotted module names for ``django/django``).
- Other languages (``utils.make_eval_script_list_common``): every command of
  ``utils.get_test_cmds(instance)`` (the spec's ``test_cmd``, a string or a list), each on its own
  line of the eval script, without directives; JavaScript repos listed in
  ``javascript.MAP_REPO_TO_TEST_CMDS`` compute their commands from the test patch instead.

Log parsers are the ``parse_log_*`` functions of the ``swebench.harness.log_parsers`` modules;
``MAP_REPO_TO_PARSER`` picks one per known repo.

``swebench`` is imported lazily, on the first call that needs it; when it is missing the
``ImportError`` names the ``sandlot[eval]`` extra.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
import re
import shlex
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sandlot.datasets.errors import DatasetMessageError
from sandlot.datasets.instance import DEFAULT_LOG_PARSER, Instance
from sandlot.datasets.r2e_gym import R2E_GYM_LOG_PARSER
from sandlot.datasets.r2e_gym import parse_log as parse_log_r2e_gym
from sandlot.datasets.swebench_requirements import read_requirements
from sandlot.datasets.swebench_tasks import repo_version_specs, row_test_cmd, specs_missing_reason
from sandlot.sandboxes.environment import EnvironmentRecipe, ProjectSource

log = logging.getLogger("sandlot.datasets.swebench_specs")

LogParser = Callable[[str, Any], dict[str, str]]
"""``parser(log, test_spec) -> {test_id: status}``, the signature of swebench's log parsers."""

_PARSER_PREFIX = "parse_log_"


class SpecError(DatasetMessageError):
    """An instance's test command or log parser cannot be resolved."""


def _swebench(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module} could not be imported ({exc}); deriving test commands and log parsers "
            f"needs swebench: pip install 'sandlot[eval]'"
        ) from exc


def resolve_test_cmd(instance: Instance) -> str:
    """Return the command that runs ``instance``'s tests (run with the repository as cwd).

    Args:
        instance: an :class:`Instance`. Its ``test_cmd``, when set, is returned unchanged
            (``swebench`` is not imported); else the command of its ``eval_script`` (a swebench
            5.x row: :func:`~sandlot.datasets.swebench_tasks.command_of_eval_script`).
            Otherwise ``repo`` and ``version`` select
            ``MAP_REPO_VERSION_TO_SPECS[repo][version]`` of swebench 4.1 and the command is
            composed as the harness does (see the module docstring): for Python repos the
            spec's ``test_cmd`` followed by the test directives of ``test_patch``, e.g.
            ``"pytest -rA astropy/io/tests/test_x.py"``; for other languages the spec's commands,
            one per line.

    Raises:
        SpecError: no ``test_cmd`` and none can be derived (repo or version unset, repo or
            version unknown to swebench's specs, or a spec without a test command). The
            message names the instance, repo and version and says to set ``test_cmd``.
        ImportError: ``swebench`` is needed but not installed (names ``sandlot[eval]``).
    """
    if instance.test_cmd:
        return instance.test_cmd
    from_script = row_test_cmd(instance.model_extra)  # swebench 5.x rows carry their script
    if from_script:
        return from_script

    def fail(reason: str) -> SpecError:
        return SpecError(
            f"instance {instance.instance_id!r} (repo {instance.repo or '<unset>'!r}, "
            f"version {instance.version!r}) has no test_cmd and none can be derived from "
            f"swebench's specifications: {reason}; set test_cmd on the instance"
        )

    if not instance.repo or instance.version is None:
        raise fail("both repo and version are needed to look up a spec")
    constants = _swebench("swebench.harness.constants")
    missing = specs_missing_reason()
    if missing:
        raise fail(missing)
    by_version = repo_version_specs().get(instance.repo)
    if by_version is None:
        raise fail("the repo has no specs")
    spec = by_version.get(instance.version)
    if spec is None:
        known = ", ".join(repr(v) for v in by_version)
        raise fail(f"the repo's specs have no version {instance.version!r} (known: {known})")
    if not spec.get("test_cmd"):
        raise fail("the spec has no test_cmd")

    record = instance.model_dump()
    if constants.MAP_REPO_TO_EXT.get(instance.repo) == "py":
        directives = _swebench("swebench.harness.test_spec.python").get_test_directives(record)
        return " ".join([spec["test_cmd"], *directives])
    javascript = _swebench("swebench.harness.test_spec.javascript")
    custom = javascript.MAP_REPO_TO_TEST_CMDS.get(instance.repo)
    if custom is not None:
        commands = custom(record)
    else:
        commands = _swebench("swebench.harness.test_spec.utils").get_test_cmds(record)
    return "\n".join(commands)


@functools.cache
def _log_parsers() -> dict[str, LogParser]:
    package = _swebench("swebench.harness.log_parsers")
    parsers: dict[str, LogParser] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = _swebench(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.startswith(_PARSER_PREFIX) and callable(value):
                parsers.setdefault(name, value)
    return parsers


def available_log_parsers() -> list[str]:
    """Return the sorted names of swebench's log parsers (``parse_log_django``, ...).

    They are the ``parse_log_*`` functions of every ``swebench.harness.log_parsers`` module.

    Raises:
        ImportError: ``swebench`` is not installed (names ``sandlot[eval]``).
    """
    return sorted(_log_parsers())


def resolve_log_parser(instance: Instance) -> LogParser:
    """Return the swebench log parser that grades ``instance``'s test output.

    Args:
        instance: an :class:`Instance`. ``instance.log_parser`` names a function of the
            ``swebench.harness.log_parsers`` modules, with or without its ``parse_log_``
            prefix (``"parse_log_django"`` or ``"django"``), or is ``"r2e_gym"``, R2E-Gym's
            parser (:mod:`sandlot.datasets.r2e_gym`; such rows are graded by R2E-Gym's rule).
            When it is unset, the parser is ``MAP_REPO_TO_PARSER[instance.repo]`` for repos
            swebench knows, else ``parse_log_pytest``.

    Returns:
        ``parser(log, test_spec) -> {test_id: status}`` where status is a
        ``swebench.harness.constants.TestStatus`` value (``"PASSED"``, ``"FAILED"``, ...).

    Raises:
        SpecError: ``log_parser`` names no known parser; the message lists the valid names.
        ImportError: ``swebench`` is not installed (names ``sandlot[eval]``).
    """
    name = instance.log_parser
    if name == R2E_GYM_LOG_PARSER:
        return parse_log_r2e_gym
    parsers = _log_parsers()
    if name is None:
        # swebench 5.x has no repo → parser map: its rows name their parser.
        by_repo = getattr(_swebench("swebench.harness.log_parsers"), "MAP_REPO_TO_PARSER", {})
        parser: LogParser = by_repo.get(instance.repo, parsers[DEFAULT_LOG_PARSER])
        return parser
    full = name if name.startswith(_PARSER_PREFIX) else _PARSER_PREFIX + name
    if full not in parsers:
        raise SpecError(
            f"instance {instance.instance_id!r}: unknown log_parser {name!r}; valid names "
            f"(the {_PARSER_PREFIX} prefix is optional): {R2E_GYM_LOG_PARSER}, "
            f"{', '.join(sorted(parsers))}"
        )
    return parsers[full]


# swebench's `packages` values that name a file of the repository instead of packages.
_REQUIREMENTS_FILE = "requirements.txt"
_CONDA_FILE = "environment.yml"

# pre_install commands that need root, apt or the network: they change the system, not the
# repository (e.g. django's locale set-up, matplotlib's qhull download, apt-get installs).
_SYSTEM_STEP = re.compile(r"^\s*(apt-get|locale-gen)\b|\bwget\b|\s/etc/|QHULL")


def _spec(repo: str, version: str | None) -> dict[str, Any] | None:
    constants = _swebench("swebench.harness.constants")
    if getattr(constants, "MAP_REPO_TO_EXT", {}).get(repo) != "py":  # 5.x has none
        return None
    spec: dict[str, Any] | None = repo_version_specs().get(repo, {}).get(version)
    return spec


def local_pre_install(commands: list[str]) -> tuple[list[str], list[str]]:
    """Split a spec's ``pre_install`` into what runs in ``local``'s jail and what cannot.

    The jail has no root over the system, no package manager and no network: ``apt-get``,
    ``locale-gen``, writes into ``/etc`` and downloads (``wget``, and matplotlib's qhull
    steps that unpack the download) cannot run there; edits of the repository's files
    (``sed -i ... setup.py``) can.

    Returns:
        ``(kept, left_out)``, each in the spec's order.
    """
    kept = [c for c in commands if not _SYSTEM_STEP.search(c)]
    return kept, [c for c in commands if c not in kept]


def spec_environment(instance: Instance, *, source: str | None = None) -> EnvironmentRecipe | None:
    """The environment recipe of swebench 4.1's specification for ``repo`` + ``version``.

    Used on backends that build environments themselves (``local``) for instances that carry
    none, and by ``data prepare --backend local``, whose rows then carry it. As swebench builds
    it (``swebench.harness.test_spec.python``): ``python``; ``requirements``, either the
    repository's requirements file at ``environment_setup_commit`` (spec ``packages:
    requirements.txt``, read with
    :func:`~sandlot.datasets.swebench_requirements.read_requirements`) or the spec's conda
    package names (``"mpmath flake8"``, installed by pip); then ``pip_packages``; then the
    repository steps ``pre_install`` (those that can run in the jail:
    :func:`local_pre_install`) and ``install``; ``project`` is the repository at
    ``base_commit``, whose build backends and dependencies the environment gets beforehand
    (the install runs without network). An instance with its own ``post_setup_cmd`` (rows
    prepared by older sandlot carry the install commands there) keeps it, without the spec's
    repository steps.

    Args:
        instance: the instance (``repo``, ``version``, ``base_commit``,
            ``environment_setup_commit`` in its extra fields).
        source: a git repository of ``repo`` on this machine (``None``: there is none; a spec
            that needs one is then refused, and ``project`` stays unset).

    Returns:
        ``None`` when the instance has no ``repo``/``version``, swebench does not know them,
        the repository is not Python, or ``swebench`` is not installed.

    Raises:
        SpecError: the spec needs the repository (a requirements file, or dependencies to
            install) and there is none on this machine; or the spec's environment is a conda
            ``environment.yml``, which ``local`` cannot build.
        RequirementsError: the requirements file cannot be read from the repository.
    """
    if not instance.repo or instance.version is None:
        return None
    try:
        spec = _spec(instance.repo, instance.version)
    except ImportError:
        return None
    if not spec:
        return None
    where = f"instance {instance.instance_id!r} ({instance.repo} {instance.version})"
    listed = str(spec.get("packages") or "")
    if listed == _CONDA_FILE:
        raise SpecError(
            f"{where}: swebench builds this spec's environment with conda from the "
            f"repository's {_CONDA_FILE}, which the local backend cannot build; run the row "
            "in its SWE-bench image (data prepare --local-images, or a container backend)"
        )
    repo_dir = source
    if listed == _REQUIREMENTS_FILE:
        if not repo_dir:
            raise SpecError(
                f"{where}: swebench installs this spec's environment from the repository's "
                "requirements file, and the instance has no repository on this machine; give "
                "it one (repo_source, or --repo-mirror DIR with <owner>__<name> mirrors)"
            )
        extra = instance.model_extra or {}
        commit = str(extra.get("environment_setup_commit") or instance.base_commit)
        requirements = read_requirements(instance.repo, repo_dir, commit).split("\n")
    else:
        requirements = shlex.split(listed)
    pre_install, left_out = local_pre_install([str(c) for c in spec.get("pre_install", [])])
    if left_out:
        log.warning(
            "%s: pre_install steps left out on local (they need root, apt or the network): %s",
            where,
            "; ".join(left_out),
        )
    install = spec.get("install")
    own_setup = bool(instance.post_setup_cmd)
    project = None
    if install and repo_dir:
        project = ProjectSource(
            source=repo_dir,
            commit=instance.base_commit,
            target=install_target(str(install)),
            edits=pre_install,
        )
    return EnvironmentRecipe(
        python=spec.get("python"),
        requirements=requirements,
        pip_packages=[str(p) for p in spec.get("pip_packages", [])],
        project=project,
        pre_install=[] if own_setup else pre_install,
        install=None if own_setup else (install or None),
    )


def install_target(install: str) -> str:
    """What a spec's ``install`` command installs: ``".[test]"`` for ``python -m pip install -e
    .[test] --verbose``, ``"."`` for ``python setup.py install`` and anything else."""
    for word in shlex.split(install.split(";")[0]):
        if word == "." or word.startswith(".["):
            return word
    return "."


NON_TEST_EXTS = (
    ".json",
    ".png",
    "csv",
    ".txt",
    ".md",
    ".jpg",
    ".jpeg",
    ".pkl",
    ".yml",
    ".yaml",
    ".toml",
)
"""``swebench.harness.constants.NON_TEST_EXTS``: files of a test patch that are not test targets."""
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def test_directives(test_patch: str) -> list[str]:
    """Test files a patch adds or changes (not deletes), minus data files, in patch order.

    The same list as swebench's ``get_test_directives`` for non-Django repositories
    (``swebench/harness/test_spec/python.py``: the patch's changed files that are not removed,
    without :data:`NON_TEST_EXTS`).
    """
    files: list[str] = []
    chunks = _DIFF_HEADER.split(test_patch)
    # split() yields [prefix, a, b, body, a, b, body, ...]
    for i in range(1, len(chunks) - 2, 3):
        new_path, body = chunks[i + 1], chunks[i + 2]
        deleted = re.search(r"^deleted file mode|^\+\+\+ /dev/null", body, re.MULTILINE)
        if deleted or new_path.endswith(NON_TEST_EXTS) or new_path in files:
            continue
        files.append(new_path)
    return files
