"""SWE-bench specs on ``local`` with real upstream source: swebench's recipe, built offline.

Each case is a release's sdist from the package index (``$PIP_INDEX_URL``, else PyPI), made a
git repository at test time (its one commit is both ``base_commit`` and
``environment_setup_commit``; nothing is committed to sandlot), evaluated on ``local`` with no
``environment`` of its own: the recipe comes from swebench 4.1's spec for the row's ``repo`` +
``version`` and is built as on real rows (the requirements file read from the repository, then
``pip_packages``, the project's build backends and dependencies ahead, the ``install`` offline
in the jail). The graded test and the "fix" are small and made up (the releases are not a
SWE-bench base); the environment they run in is the spec's:

- flask 2.3 (Python 3.11): ``packages: requirements.txt`` (``requirements/dev.txt`` and its
  ``-r`` includes give pytest), ``pip_packages`` pinning ``MarkupSafe==2.1.1`` over the
  requirements' 2.1.3 (a PASS_TO_PASS test checks the pin won), a ``flit_core`` build backend;
- sympy 1.1 (Python 3.9): ``packages: "mpmath flake8"``, conda names installed by pip, and
  sympy's ``bin/test`` runner (written into the repository: the sdist has none) with
  swebench's sympy log parser.

The gold patch resolves; the empty patch and a patch that does not fix it do not.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from requirements import EVAL, bwrap_missing, missing, need_module, needs

from sandlot.datasets.instance import Instance
from sandlot.errors import EnvironmentBuildError
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.result import EvalStatus
from sandlot.sandboxes.local.pythons import find_interpreter

need_module("swebench", EVAL)

# Each case builds an environment from PyPI sdists: about 2.5 min on an idle 2-core machine.
pytestmark = [needs(bwrap_missing), pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Case:
    project: str
    sdist: str
    repo: str
    version: str
    python: str
    test_file: str
    test_body: str
    fixed_file: str
    fixed_line: str
    fail_to_pass: str
    pass_to_pass: tuple[str, ...] = ()
    scripts: tuple[tuple[str, str], ...] = ()
    """Executable files of the repository the sdist leaves out, ``(path, text)``."""


FLASK = Case(
    project="flask",
    sdist="flask-2.3.3.tar.gz",
    repo="pallets/flask",
    version="2.3",
    python="3.11",
    test_file="tests/test_sandlot_marker.py",
    test_body=(
        "import markupsafe\n\nimport flask\n\n\ndef test_marker():\n"
        "    assert flask.sandlot_marker == 1\n\n\ndef test_markupsafe_pin():\n"
        '    assert markupsafe.__version__ == "2.1.1"\n'
    ),
    fixed_file="src/flask/__init__.py",
    fixed_line="sandlot_marker = {}\n",
    fail_to_pass="tests/test_sandlot_marker.py::test_marker",
    pass_to_pass=("tests/test_sandlot_marker.py::test_markupsafe_pin",),
)
SYMPY = Case(
    project="sympy",
    sdist="sympy-1.1.1.tar.gz",
    repo="sympy/sympy",
    version="1.1",
    python="3.9",
    test_file="sympy/core/tests/test_sandlot_marker.py",
    test_body=(
        "import mpmath\n\nimport sympy\n\n\ndef test_marker():\n"
        "    assert sympy.sandlot_marker == 1\n\n\ndef test_mpmath():\n"
        "    assert mpmath.mpf(1) + 1 == 2\n\n\n"
        # swebench's sympy parser misses the last test of a file ("test_x ok  [OK]"): not graded.
        "def test_zz_last():\n    pass\n"
    ),
    fixed_file="sympy/__init__.py",
    fixed_line="sandlot_marker = {}\n",
    fail_to_pass="test_marker",
    pass_to_pass=("test_mpmath",),
    # The spec's test_cmd is the repository's `bin/test -C --verbose <files>`, not in the sdist:
    # the same entry point, sympy.test, with the file arguments and --verbose.
    scripts=(
        (
            "bin/test",
            "#!/usr/bin/env python\nimport sys\n\nimport sympy\n\n"
            "paths = [a for a in sys.argv[1:] if not a.startswith('-')]\n"
            "sys.exit(not sympy.test(*paths, verbose='--verbose' in sys.argv))\n",
        ),
    ),
)


def _sdist(case: Case, dest: Path) -> Path:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    page_url = f"{index}/{case.project}/"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(page_url, headers=accept), timeout=30
        ) as page:
            files = json.load(page)["files"]
        [url] = [f["url"] for f in files if f["filename"] == case.sdist]
        with urllib.request.urlopen(urllib.parse.urljoin(page_url, url), timeout=300) as r:
            data = r.read()
    except (OSError, ValueError, KeyError) as exc:
        missing(f"{case.sdist} cannot be downloaded from {index} ({exc})")
    path = dest / case.sdist
    path.write_bytes(data)
    return path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=sandlot", "-c", "user.email=s@l", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _diff(repo: Path, rel: str, new_text: str) -> str:
    """The patch that turns ``rel`` of the base into ``new_text`` (restored after)."""
    path = repo / rel
    old = path.read_text() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new_text)
    _git(repo, "add", "-N", rel)
    try:
        return _git(repo, "diff", "--", rel) + "\n"
    finally:
        if old is None:
            _git(repo, "rm", "-q", "--cached", rel)
            path.unlink()
        else:
            path.write_text(old)


def _instance(case: Case, tmp: Path) -> tuple[Instance, dict[str, str]]:
    try:
        find_interpreter(case.python)
    except EnvironmentBuildError as exc:
        missing(f"swebench's {case.repo} {case.version} spec needs Python {case.python} ({exc})")
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(_sdist(case, tmp)) as tar:
        tar.extractall(tmp / "src", **safe)
    [repo] = (tmp / "src").iterdir()
    for rel, text in case.scripts:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
        (repo / rel).chmod(0o755)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A", "-f")
    _git(repo, "-c", "commit.gpgsign=false", "commit", "-qm", case.sdist)
    base = _git(repo, "rev-parse", "HEAD")
    fixed = (repo / case.fixed_file).read_text()
    patches = {
        "gold": _diff(repo, case.fixed_file, fixed + case.fixed_line.format(1)),
        "no fix": _diff(repo, case.fixed_file, fixed + case.fixed_line.format(2)),
        "empty": "",
    }
    instance = Instance(
        instance_id=f"{case.repo.replace('/', '__')}-1",
        repo=case.repo,
        version=case.version,
        base_commit=base,
        environment_setup_commit=base,
        test_patch=_diff(repo, case.test_file, case.test_body),
        patch=patches["gold"],
        FAIL_TO_PASS=[case.fail_to_pass],
        PASS_TO_PASS=list(case.pass_to_pass),
        repo_source=str(repo),
        eval_timeout=600,
    )
    return instance, patches


@pytest.mark.parametrize("case", [FLASK, SYMPY], ids=lambda c: f"{c.repo} {c.version}")
def test_a_spec_built_offline_gives_the_harness_verdicts(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    instance, patches = _instance(case, tmp_path)
    assert instance.environment is None  # the spec's recipe, as for a published row

    details: dict[str, object] = {}

    async def run_all() -> dict[str, EvalStatus]:
        results = {}
        for name, patch in patches.items():
            result = await evaluate(instance, patch, backend="local")
            assert result.error is None, f"{name}: {result.error}"
            results[name] = result.status
            details[name] = (result.tests_status, result.log[-2000:])
        return results

    assert anyio.run(run_all) == {
        "gold": EvalStatus.RESOLVED,
        "no fix": EvalStatus.UNRESOLVED,
        "empty": EvalStatus.EMPTY_PATCH,
    }, details
