"""SWE-rebench → verl parquet rows.

Usage::

    DEPLOYMENT=modal python -m sandlot.datasets.swe_rebench --local-save-dir ~/data/swe_agent
    # → ~/data/swe_agent/swe_rebench_filtered_modal.parquet (also: sandlot data prepare swe_rebench)

Source: the Hugging Face dataset ``nebius/SWE-rebench`` (arXiv 2505.20411), split ``filtered``.
Its rows have the SWE-bench columns (``instance_id``, ``repo``, ``base_commit``, ``patch``,
``test_patch``, ``problem_statement``, ``hints_text``, ``created_at``, ``version``,
``environment_setup_commit``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``; the test lists are lists,
JSON text is accepted too) plus ``FAIL_TO_FAIL``, ``PASS_TO_FAIL``, ``meta``, ``license_name``,
``requirements`` and ``environment`` (the frozen pip/conda environment the image was built
from) and ``install_config``, the image recipe, an object with ``python``, ``packages``,
``pip_packages``, ``pre_install`` (list), ``install`` (command), ``reqs_path``,
``env_yml_path``, ``no_use_env``, ``test_cmd`` and ``log_parser`` (``parse_log_pytest`` or
``parse_log_pytest_v2``). Field use follows the SWE-rebench fork of the SWE-bench harness
(``swe-rebench/SWE-bench-fork``, ``swebench/harness/test_spec/python.py``) and uni-agent's
``uni_agent/reward/swe_rebench.py``.

Conversion: every column except ``requirements`` and ``environment`` (large, used only to build
images) is kept in the instance. The test command is, as in the fork's eval script,
``install_config.test_cmd`` followed by the test files of ``test_patch``
(:func:`test_directives`); on images it is preceded by ``install_config.install``, which the
harness re-runs before every test run. ``log_parser`` is ``install_config.log_parser``.

Environment: the images (family ``swe-rebench``) hold a full clone of the repository, whose
history after ``base_commit`` every sandbox's set-up removes
(:func:`sandlot.datasets.sandbox_setup.prepare_repo`), so rows carry no cleanup of their own: it
would run twice. ``DEPLOYMENT=local`` rows clone from the mirror directory and then run
``install_config.pre_install`` and ``install`` as their ``post_setup_cmd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandlot.datasets.command import run_preprocessor
from sandlot.datasets.images import IMAGE_PATH, image_name
from sandlot.datasets.prepare import ConvertContext, Preprocessor, SourceError
from sandlot.datasets.row_fields import image_environment, local_environment
from sandlot.datasets.swebench_specs import test_directives
from sandlot.sandboxes.images import ImageFamily

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "install_config",
)
DROPPED = ("requirements", "environment")
"""Source columns not kept in the instance: the frozen environments the images were built from."""


def convert(record: Mapping[str, Any], ctx: ConvertContext) -> dict[str, Any]:
    """One SWE-rebench row → ``Instance`` fields for ``ctx.backend``."""
    config = record["install_config"]
    if not isinstance(config, Mapping):
        raise SourceError("install_config", f"must be an object, got {type(config).__name__}")
    test_cmd = config.get("test_cmd")
    if isinstance(test_cmd, list):
        test_cmd = " ".join(str(part) for part in test_cmd)
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise SourceError("install_config", "install_config.test_cmd is missing or empty")
    pre_install = config.get("pre_install") or []
    if not isinstance(pre_install, list):
        raise SourceError("install_config", "install_config.pre_install must be a list")
    install = str(config.get("install") or "")
    directives = test_directives(str(record["test_patch"]))
    data = {k: v for k, v in record.items() if k not in DROPPED}
    data["log_parser"] = config.get("log_parser") or "parse_log_pytest"
    run_tests = " ".join([test_cmd, *directives])
    if ctx.backend == "local":
        setup = "\n".join([*map(str, pre_install), install]).strip()
        data.update(local_environment(record, ctx, setup or None))
        # The local backend builds this as a cached virtualenv: the row's tests never run on
        # the caller's Python. Install steps stay in the setup.
        data["environment"] = {
            "python": config.get("python"),
            "pip_packages": [str(p) for p in config.get("pip_packages") or []],
        }
        data["test_cmd"] = run_tests
    else:
        image = image_name(
            ImageFamily.SWE_REBENCH,
            str(record["instance_id"]),
            ctx.backend,
            overrides=ctx.image_overrides,
        )
        data.update(image_environment(record, image, IMAGE_PATH[ImageFamily.SWE_REBENCH], None))
        data["test_cmd"] = f"{install}\n{run_tests}" if install else run_tests
    return data


PREPROCESSOR = Preprocessor(
    name="swe_rebench",
    hf_id="nebius/SWE-rebench",
    default_split="filtered",
    output_stem="swe_rebench_{split}",
    reward_name="swe_rebench",
    required=REQUIRED,
    convert=convert,
)

if __name__ == "__main__":
    run_preprocessor(PREPROCESSOR)
