"""Shell snippets of a test-patch evaluation, following the SWE-bench harness.

Sources: ``swebench.harness.constants.GIT_APPLY_CMDS`` (patch fallbacks) and
``swebench.harness.test_spec.python.make_eval_script_list_py`` (reset the files the test patch
touches to ``base_commit``, apply the test patch, run the tests between markers). Each step is
its own ``exec`` here, so exit statuses travel out of band instead of through the log.
"""

from __future__ import annotations

import re
import shlex

# The harness's fallback order (GIT_APPLY_CMDS in swebench 4.1).
PATCH_APPLY_COMMANDS = (
    "git apply --verbose",
    "git apply --verbose --reject",
    "patch --batch --fuzz=5 -p1 -i",
)
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
EVAL_DIR = "/tmp/sandlot_eval"
MODEL_PATCH_PATH = f"{EVAL_DIR}/model.patch"
TEST_PATCH_PATH = f"{EVAL_DIR}/test.patch"

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def patch_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (both sides of renames), in order, without repeats.

    For the instance's own ``test_patch`` (trusted text). What a model patch changed is never
    read from its text: see :mod:`sandlot.rewards.integrity.changes`.
    """
    seen: dict[str, None] = {}
    for a, b in _DIFF_HEADER.findall(patch):
        seen.setdefault(a)
        seen.setdefault(b)
    return [p for p in seen if p != "/dev/null"]


def reset_test_files_script(base_commit: str, files: list[str]) -> str:
    """Restore ``files`` to ``base_commit``; files absent there are deleted.

    Only the named files are touched, so a test patch that merely adds files never resets the
    repo (the bug of SWE-bench issue #518). Undoes any edit the model made to the tests.
    Run it with ``set -e`` so a failed checkout stops the evaluation.
    """
    if not files:
        return "true\n"
    q_commit = shlex.quote(base_commit)
    lines = [
        f"if git cat-file -e {q_commit}:{shlex.quote(f)} 2>/dev/null; "
        f"then git checkout -q {q_commit} -- {shlex.quote(f)}; else rm -rf -- {shlex.quote(f)}; fi"
        for f in files
    ]
    return "\n".join(lines) + "\n"


def apply_test_patch_script() -> str:
    """Apply the test patch written at ``TEST_PATCH_PATH``."""
    return f"git apply --verbose {TEST_PATCH_PATH}"


def eval_script(
    *, workdir: str, base_commit: str, test_files: list[str], test_cmd: str, env_setup: str = ""
) -> str:
    """The whole evaluation as one reproducible ``eval.sh`` (written next to the logs).

    sandlot runs the same steps as separate commands; this file lets a person replay them.
    """
    return (
        "#!/bin/bash\n"
        "set -uo pipefail\n"
        f"cd {shlex.quote(workdir)}\n"
        f"{env_setup}"
        f"git apply --verbose {MODEL_PATCH_PATH}  # or the fallbacks: "
        f"{'; '.join(PATCH_APPLY_COMMANDS[1:])}\n"
        f"{reset_test_files_script(base_commit, test_files)}"
        f"{apply_test_patch_script()}\n"
        f": '{START_TEST_OUTPUT}'\n"
        f"{test_cmd}\n"
        "rc=$?\n"
        f": '{END_TEST_OUTPUT}'\n"
        f"{reset_test_files_script(base_commit, test_files)}"
        "exit $rc\n"
    )
