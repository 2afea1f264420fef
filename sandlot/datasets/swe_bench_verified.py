"""SWE-bench Verified → verl parquet rows.

Usage::

    DEPLOYMENT=modal python -m sandlot.datasets.swe_bench_verified --local-save-dir ~/data/swe_agent
    # → ~/data/swe_agent/swe_bench_verified_modal.parquet
    # the same: sandlot data prepare swe_bench_verified --local-save-dir ~/data/swe_agent

Source: the Hugging Face dataset ``princeton-nlp/SWE-bench_Verified``, split ``test`` (500 rows;
dataset card at huggingface.co/datasets/princeton-nlp/SWE-bench_Verified). Its columns, all
strings: ``repo`` (``"owner/name"``), ``instance_id``, ``base_commit``, ``patch`` (gold),
``test_patch``, ``problem_statement``, ``hints_text``, ``created_at``, ``version``,
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (JSON-encoded lists of test ids),
``environment_setup_commit``; some exports add ``difficulty``. Every column is kept in the
instance (``metadata``); sandlot's own instance fields (``test_cmd``, ``log_parser``, ``env``,
``eval_timeout``) pass through when a source row has them, so sandlot's JSONL instance files
(``examples/swe-mini/instances.jsonl``) convert too.

Environment: the SWE-bench images (``sandlot.datasets.images``, family ``swe-bench``) hold the
repository at ``base_commit`` in ``/testbed`` with history after it already removed by the
harness, so rows use the image as is: no ``post_setup_cmd``; ``PATH`` selects the image's conda
environment. The test command is derived at evaluation time from swebench's specifications
(``sandlot.datasets.swebench_specs``). ``DEPLOYMENT=local`` rows clone the repository from the
mirror directory and carry the spec's environment recipe
(:func:`~sandlot.datasets.swebench_specs.spec_environment`: interpreter, the requirements file
read from the mirror at ``environment_setup_commit``, ``pip_packages``, the project's
dependencies, ``pre_install`` and ``install``), so the row shows what its environment is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sandlot.datasets.command import run_preprocessor
from sandlot.datasets.images import IMAGE_PATH, image_name
from sandlot.datasets.instance import Instance
from sandlot.datasets.prepare import ConvertContext, Preprocessor, SourceError
from sandlot.datasets.row_fields import image_environment, local_environment
from sandlot.datasets.swebench_requirements import RequirementsError
from sandlot.datasets.swebench_specs import SpecError, spec_environment
from sandlot.sandboxes.images import ImageFamily

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


def convert(record: Mapping[str, Any], ctx: ConvertContext) -> dict[str, Any]:
    """One SWE-bench row → ``Instance`` fields for ``ctx.backend``."""
    data = dict(record)
    instance_id = str(record["instance_id"])
    if ctx.backend == "local":
        data.update(local_environment(record, ctx, None))
        if data.get("environment") is None:  # a row's own recipe wins over the spec's
            try:
                recipe = spec_environment(
                    Instance.model_validate(data), source=str(data["repo_source"])
                )
            except (SpecError, RequirementsError) as exc:
                raise SourceError("version", str(exc)) from None
            except ValidationError:
                recipe = None  # the row itself is invalid: convert_record names the field
            data["environment"] = recipe.model_dump() if recipe else None
    else:
        image = image_name(
            ImageFamily.SWE_BENCH, instance_id, ctx.backend, overrides=ctx.image_overrides
        )
        data.update(image_environment(record, image, IMAGE_PATH[ImageFamily.SWE_BENCH], None))
    return data


PREPROCESSOR = Preprocessor(
    name="swe_bench_verified",
    hf_id="princeton-nlp/SWE-bench_Verified",
    default_split="test",
    output_stem="swe_bench_verified",
    reward_name="swe_bench",
    required=REQUIRED,
    convert=convert,
)

if __name__ == "__main__":
    run_preprocessor(PREPROCESSOR)
