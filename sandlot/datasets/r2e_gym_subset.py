"""R2E-Gym (subset) → verl parquet rows.

Usage::

    DEPLOYMENT=vefaas python -m sandlot.datasets.r2e_gym_subset --local-save-dir ~/data/swe_agent
    # → ~/data/swe_agent/r2e_gym_subset_vefaas.parquet (also: sandlot data prepare r2e_gym_subset)

Source: the Hugging Face dataset ``R2E-Gym/R2E-Gym-Subset`` (arXiv 2504.07164), split ``train``;
uni-agent trains on the filtered copy ``dyyyyyyyy/r2e-gym-subset-filtered`` (same columns, pass
it with ``--input``). Columns (dataset card): ``repo_name`` (``"aiohttp"``), ``docker_image``,
``commit_hash`` (the fixing commit), ``parsed_commit_content`` (JSON of R2E-Gym's
``ParsedCommit``, see :mod:`sandlot.datasets.r2e_commit`), ``execution_result_content``,
``modified_files``, ``modified_entity_summaries``, ``relevant_files``, ``num_non_test_files``,
``num_non_test_func_methods``, ``num_non_test_lines``, ``prompt`` (the prompt R2E-Gym used to
write the issue; never used here), ``problem_statement`` and ``expected_output_json`` (JSON
``{test id: status}`` of R2E-Gym's hidden tests with the fix applied).

Conversion (R2E-Gym's ``r2egym/agenthub/runtime/docker.py`` and uni-agent's
``examples/data_preprocess/r2e_gym_subset_filtered.py``): ``instance_id`` is
``<repo_name>__<commit_hash[:10]>``; ``base_commit`` is the commit's parent
(``old_commit_hash``); ``patch`` is the commit's non-test Python diff; the problem statement is
the text between ``[ISSUE]`` and ``[/ISSUE]`` when present. The graded tests are not in a
``test_patch`` but in the image (``/r2e_tests``), so ``test_patch`` is empty and the tests are
run by the image's ``run_tests.sh`` with the tests linked into the repository for the run only.
Rows are graded as R2E-Gym grades them (``log_parser`` ``r2e_gym``,
:mod:`sandlot.datasets.r2e_gym` and :mod:`sandlot.rewards.r2e_grading`): the parsed statuses
must equal ``expected_output_json``, expected failures included. ``FAIL_TO_PASS`` lists the
tests expected to pass, keyed as R2E-Gym keys them (``TestClass.test_name`` or ``test_name``,
no file path), for reports and for ``sandlot data validate``. Only the columns named in
:data:`KEPT` stay in the instance.

Environment: ``post_setup_cmd`` sets up R2E-Gym's layout (``r2e_gym.SETUP_CMD``); the hidden tests
and ``run_tests.sh`` move out of the repository to ``/root``. ``graded_paths`` lists them
(``r2e_gym.GRADED_PATHS``): the agent's sandbox deletes them before the model's first turn, the
evaluation's fresh sandbox keeps them. ``DEPLOYMENT=local`` is not supported: the graded tests
exist only inside the images.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from sandlot.datasets import r2e_gym
from sandlot.datasets.command import run_preprocessor
from sandlot.datasets.images import IMAGE_PATH, ImageNameError, image_name
from sandlot.datasets.prepare import ConvertContext, Preprocessor, SourceError
from sandlot.datasets.r2e_commit import gold_patch
from sandlot.datasets.row_fields import image_environment
from sandlot.sandboxes.images import ImageFamily

REQUIRED = (
    "repo_name",
    "commit_hash",
    "parsed_commit_content",
    "problem_statement",
    "expected_output_json",
)
KEPT = (
    "repo_name",
    "docker_image",
    "commit_hash",
    "modified_files",
    "relevant_files",
    "num_non_test_files",
    "num_non_test_func_methods",
    "num_non_test_lines",
    "expected_output_json",
)

_ISSUE = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)


def passing_tests(expected_output_json: str) -> list[str]:
    """Sorted keys of the tests ``expected_output_json`` expects to pass (R2E-Gym's keys).

    Raises:
        SourceError: not a JSON object, or no test is expected to pass.
    """
    try:
        return r2e_gym.passing_tests(expected_output_json)
    except ValueError as exc:
        raise SourceError("expected_output_json", str(exc)) from None


def convert(record: Mapping[str, Any], ctx: ConvertContext) -> dict[str, Any]:
    """One R2E-Gym row → ``Instance`` fields for ``ctx.backend``."""
    try:
        commit = json.loads(record["parsed_commit_content"])
        base_commit = str(commit["old_commit_hash"])
        patch = gold_patch(commit)
    except (TypeError, KeyError, json.JSONDecodeError) as exc:
        raise SourceError(
            "parsed_commit_content", f"not R2E-Gym's ParsedCommit JSON ({exc!r})"
        ) from None
    if not patch:
        raise SourceError("parsed_commit_content", "the commit changes no non-test Python file")
    commit_hash = str(record["commit_hash"])
    instance_id = f"{record['repo_name']}__{commit_hash[:10]}"
    statement = str(record["problem_statement"])
    issue = _ISSUE.search(statement)
    try:
        image = image_name(
            ImageFamily.R2E_GYM,
            instance_id,
            ctx.backend,
            source_image=record.get("docker_image"),
            commit=commit_hash,
            overrides=ctx.image_overrides,
        )
    except ImageNameError as exc:
        raise SourceError("docker_image", str(exc)) from None
    data = {k: record[k] for k in KEPT if k in record}
    data.update(
        instance_id=instance_id,
        repo=str(record["repo_name"]),
        base_commit=base_commit,
        patch=patch,
        test_patch="",
        FAIL_TO_PASS=passing_tests(record["expected_output_json"]),
        PASS_TO_PASS=[],
        problem_statement=issue.group(1).strip() if issue else statement,
        test_cmd=r2e_gym.TEST_CMD,
        log_parser=r2e_gym.R2E_GYM_LOG_PARSER,
        graded_paths=list(r2e_gym.GRADED_PATHS),
    )
    data.update(
        image_environment(record, image, IMAGE_PATH[ImageFamily.R2E_GYM], r2e_gym.SETUP_CMD)
    )
    return data


PREPROCESSOR = Preprocessor(
    name="r2e_gym_subset",
    hf_id="R2E-Gym/R2E-Gym-Subset",
    default_split="train",
    output_stem="r2e_gym_subset",
    reward_name="r2e_gym",
    required=REQUIRED,
    convert=convert,
    backends=("docker", "modal", "vefaas"),
)

if __name__ == "__main__":
    run_preprocessor(PREPROCESSOR)
