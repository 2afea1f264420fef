"""The grader's files must not change while the tests run.

Code under test runs before pytest has imported every test module (test modules import it), so it
could rewrite a test file that is collected later, or a conftest of a directory not yet
visited. The files that grade the instance (those of ``test_patch``, those holding a
FAIL_TO_PASS or PASS_TO_PASS test, every ``conftest.py``) are hashed right before the test
command and right after it; a difference is a violation. A rewrite that is undone before the
command ends is not seen by this check (see ``docs/reward-integrity.md``).
"""

from __future__ import annotations

import shlex

from sandlot.datasets.instance import Instance
from sandlot.errors import SandlotError
from sandlot.rewards.scripts import patch_files


def grader_paths(instance: Instance) -> list[str]:
    """Repository-relative paths of the test_patch files and of the graded tests' files."""
    paths = dict.fromkeys(patch_files(instance.test_patch))
    for test in instance.FAIL_TO_PASS + instance.PASS_TO_PASS:
        if "::" in test:
            paths.setdefault(test.split("::", 1)[0])
    return list(paths)


_MARKER = "--- sandlot grader files ---"
END_MARKER = "--- sandlot grader files end ---"


class GraderFilesError(SandlotError):
    """The grader's files could not be hashed (the message carries the output)."""


def hash_script(instance: Instance) -> str:
    """Shell printing a marker line, then ``<sha256>  <path>`` for the :func:`grader_paths`
    that exist and every ``conftest.py`` outside ``.git``; run it in ``instance.workdir``."""
    listed = " ".join(shlex.quote(p) for p in grader_paths(instance))
    return (
        f"echo '{_MARKER}'\n"
        + (f'for f in {listed}; do [ ! -f "$f" ] || sha256sum -- "$f"; done\n' if listed else "")
        + "find . -path ./.git -prune -o -name conftest.py -type f -exec sha256sum -- {} +\n"
        + f"echo '{END_MARKER}'\n"
    )


def parse_hashes(output: str) -> dict[str, str]:
    """``{path: sha256}`` from the output of :func:`hash_script` (between its markers)."""
    out: dict[str, str] = {}
    section = output.partition(_MARKER + "\n")[2].partition(END_MARKER + "\n")[0]
    for line in section.splitlines():
        digest, _, path = line.partition("  ")
        if path:
            out[path.removeprefix("./")] = digest
    return out


def changed_grader_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Violations naming each grader file created, deleted or rewritten during the run."""
    return [
        f"{path} changed while the tests ran"
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]
