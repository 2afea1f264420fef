"""Rows written by uni-agent's preprocessing scripts, rewritten into sandlot's row layout.

uni-agent (github.com/verl-project/uni-agent) writes two layouts; both are recognised:

- ``examples/data_preprocess/{swe_bench_verified,swe_rebench,r2e_gym_subset_filtered}.py``
  (before its refactor 55ff16b)::

      prompt, agent_name,
      extra_info.tools_kwargs = {env: {deployment: {image, [modal_sandbox_kwargs]},
                                       post_setup_cmd, [env_variables]},
                                 reward: {name, metadata}}

  with ``metadata`` and ``env_variables`` as objects (Arrow structs), no ``data_source``, no
  ``reward_model`` and no ``extra_info.index``;
- ``uni_agent/tasks/*/preprocess.py`` (after it)::

      data_source, prompt, extra_info.tools_kwargs.task = {name, sandbox: {image}, prompt, metadata}

The reward ``name`` says what ``metadata`` holds and how it is graded:

- ``swe_bench``: the whole SWE-bench row (``FAIL_TO_PASS`` as JSON text); the test command
  comes from swebench's specifications, as in uni-agent's ``reward/swe_bench.py``;
- ``swe_rebench``: SWE-bench fields plus ``install``, ``log_parser`` and ``test_cmd``, the
  ``install_config`` values; uni-agent's ``test_cmd`` is the pytest command *without* the test
  files and runs after ``install`` (``reward/swe_rebench.py``), so sandlot's ``test_cmd`` becomes
  ``install`` + newline + ``test_cmd`` + the test files of ``test_patch``, as
  :mod:`sandlot.datasets.swe_rebench` builds it;
- ``r2e_gym``: ``repo``, ``instance_id``, ``patch`` and ``expected_output_json``; graded by
  R2E-Gym's rule (:mod:`sandlot.datasets.r2e_gym`), ``FAIL_TO_PASS`` = the tests expected to
  pass. uni-agent keeps no base commit: the image holds the repository at it, so ``HEAD``
  stands in (grading needs no other commit, the tests come with the image).

Other reward names (``swe_bench_multilingual``, ``swe_rebench_v2``, ``terminal_bench``) have no
sandlot grader and are refused. The column mapping is in ``docs/datasets.md``.

What changes on the way: the environment fields of the family's preprocessor replace
uni-agent's (``PATH`` of the image's test environment, which uni-agent's eval scripts activated
themselves; for SWE-rebench no set-up command: uni-agent's tag and reflog cleanup gives way to
the removal of all history after ``base_commit`` that every sandbox's set-up runs; for R2E-Gym
the same layout set-up, with guards); the
image stays as it is, and the backend is ``vefaas`` for images in the veFaaS registry, else
``docker`` unless one is given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sandlot.datasets import r2e_gym
from sandlot.datasets.errors import DatasetMessageError
from sandlot.datasets.images import IMAGE_PATH
from sandlot.datasets.swebench_specs import test_directives
from sandlot.sandboxes.images import ImageFamily

LAYOUT = "uni-agent"
DATA_SOURCES = {
    "swe_bench": "princeton-nlp/SWE-bench_Verified",
    "swe_rebench": "nebius/SWE-rebench",
    "r2e_gym": "R2E-Gym/R2E-Gym-Subset",
}
"""uni-agent reward name → the dataset its rows come from (``data_source``)."""
_FAMILY = {
    "swe_bench": ImageFamily.SWE_BENCH,
    "swe_rebench": ImageFamily.SWE_REBENCH,
    "r2e_gym": ImageFamily.R2E_GYM,
}
_VEFAAS_REGISTRY = ".cr.volces.com"
_WORKDIR = "/testbed"


class UniAgentRowError(DatasetMessageError):
    """A uni-agent row cannot be rewritten; the message names the field."""


def is_uni_agent_row(record: Mapping[str, Any]) -> bool:
    """``True`` when ``record`` has one of uni-agent's layouts (module docstring)."""
    info = record.get("extra_info")
    tools = info.get("tools_kwargs") if isinstance(info, Mapping) else None
    if not isinstance(tools, Mapping):
        return False
    env = tools.get("env")
    return (isinstance(env, Mapping) and "deployment" in env) or isinstance(
        tools.get("task"), Mapping
    )


def to_sandlot_record(
    record: Mapping[str, Any], *, index: int | None = None, backend: str | None = None
) -> dict[str, Any]:
    """Rewrite one uni-agent row into a sandlot row record (``TaskRow.from_record`` input).

    Args:
        record: the row as read from parquet (structs as dicts).
        index: ``extra_info.index`` when the row has none (its position in the file).
        backend: ``sandbox.backend`` of the row; default ``vefaas`` for images in the veFaaS
            registry, else ``docker``.

    Raises:
        UniAgentRowError: a field is missing or the reward has no sandlot grader.
    """
    info = dict(record["extra_info"])
    tools = info.pop("tools_kwargs")
    name, image, post_setup, env_vars, metadata = _parts(tools)
    if name not in DATA_SOURCES:
        raise UniAgentRowError(
            f"reward name {name!r} has no sandlot grader; sandlot reads uni-agent rows of "
            f"{', '.join(DATA_SOURCES)}"
        )
    instance = _instance(name, metadata)
    family = _FAMILY[name]
    instance.update(
        image=image,
        workdir=_WORKDIR,
        repo_source=None,
        env={"PATH": IMAGE_PATH[family], **env_vars},
        post_setup_cmd=_setup(name, instance, post_setup),
    )
    chosen = backend or (
        "vefaas" if image.split("/", 1)[0].endswith(_VEFAAS_REGISTRY) else "docker"
    )
    instance_id = str(instance["instance_id"])
    env = {
        "image": image,
        "post_setup_cmd": instance["post_setup_cmd"],
        "workdir": _WORKDIR,
        "repo_source": None,
        "env_variables": instance["env"],
        "sandbox": {"backend": chosen, "network": False},
    }
    extra = {k: v for k, v in record.items() if k not in ("extra_info", "tools_kwargs", "index")}
    position = info.pop("index", None)
    return {
        **extra,
        "prompt": record.get("prompt"),
        "data_source": record.get("data_source") or DATA_SOURCES[name],
        "agent_name": record.get("agent_name") or "swe_agent",
        "reward_model": {"style": "rule", "ground_truth": instance_id},
        "extra_info": {
            **info,
            "index": position if position is not None else index if index is not None else 0,
            "instance_id": instance_id,
            "tools_kwargs": {"env": env, "reward": {"name": name, "metadata": instance}},
        },
    }


def _parts(tools: Mapping[str, Any]) -> tuple[str, str, str | None, dict[str, str], dict[str, Any]]:
    """``(reward name, image, post_setup_cmd, env_variables, metadata)`` of either layout."""
    if isinstance(tools.get("task"), Mapping):
        task = tools["task"]
        name, image = task.get("name"), (task.get("sandbox") or {}).get("image")
        post_setup, env_vars, metadata = None, {}, task.get("metadata")
        where = "tools_kwargs.task"
    else:
        env, reward = tools.get("env") or {}, tools.get("reward") or {}
        name, image = reward.get("name"), (env.get("deployment") or {}).get("image")
        post_setup = env.get("post_setup_cmd") or None
        env_vars = _object(env.get("env_variables"), "tools_kwargs.env.env_variables") or {}
        metadata = reward.get("metadata")
        where = "tools_kwargs.reward"
    if not isinstance(name, str) or not name:
        raise UniAgentRowError(f"{where}.name is missing")
    if not isinstance(image, str) or not image:
        raise UniAgentRowError("the row names no image (env.deployment.image / task.sandbox.image)")
    metadata = _object(metadata, f"{where}.metadata")
    if not metadata:
        raise UniAgentRowError(f"{where}.metadata is missing")
    return (
        name,
        image,
        post_setup,
        {str(k): str(v) for k, v in env_vars.items() if v is not None},
        metadata,
    )


def _instance(name: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Instance`` fields of uni-agent's metadata for reward ``name``."""
    # Arrow gives every struct the union of the rows' keys, absent ones as null.
    data = {k: v for k, v in metadata.items() if v is not None}
    if "instance_id" not in data:
        raise UniAgentRowError("metadata.instance_id is missing")
    if name == "swe_rebench":
        test_cmd = data.get("test_cmd")
        if isinstance(test_cmd, list):
            test_cmd = " ".join(str(part) for part in test_cmd)
        if not isinstance(test_cmd, str) or not test_cmd.strip():
            raise UniAgentRowError("metadata.test_cmd is missing (SWE-rebench's install_config)")
        run = " ".join([test_cmd, *test_directives(str(data.get("test_patch") or ""))])
        install = str(data.get("install") or "")
        data["test_cmd"] = f"{install}\n{run}" if install else run
        data.setdefault("log_parser", "parse_log_pytest")
    elif name == "r2e_gym":
        expected = data.get("expected_output_json")
        try:
            data["FAIL_TO_PASS"] = r2e_gym.passing_tests(expected)
        except ValueError as exc:
            raise UniAgentRowError(f"metadata.expected_output_json: {exc}") from None
        if not isinstance(expected, str):
            data["expected_output_json"] = json.dumps(expected)
        data.setdefault("base_commit", "HEAD")
        data.update(
            test_patch="",
            PASS_TO_PASS=[],
            test_cmd=r2e_gym.TEST_CMD,
            log_parser=r2e_gym.R2E_GYM_LOG_PARSER,
            graded_paths=list(r2e_gym.GRADED_PATHS),
        )
    return data


def _setup(name: str, instance: Mapping[str, Any], uni_agent_setup: str | None) -> str | None:
    if name == "swe_rebench":
        base = str(instance.get("base_commit") or "")
        if not base:
            raise UniAgentRowError("metadata.base_commit is missing")
        # uni-agent's reset leaves other branches; prepare_repo's history cleanup replaces it.
        return None
    if name == "r2e_gym":
        return r2e_gym.SETUP_CMD
    return uni_agent_setup


def _object(value: Any, field: str) -> dict[str, Any] | None:
    """An object given as a dict (Arrow struct) or as JSON text."""
    if value is None or isinstance(value, Mapping):
        return dict(value) if value is not None else None
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            raise UniAgentRowError(f"{field} is text but not JSON") from None
        if isinstance(decoded, dict):
            return decoded
    raise UniAgentRowError(f"{field} must be an object, got {type(value).__name__}")
