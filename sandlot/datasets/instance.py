"""``Instance``: one SWE-bench style task and how to build its environment and run its tests.

Field names follow the SWE-bench harness dataset schema (``instance_id``, ``repo``,
``base_commit``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``version``,
``problem_statement``; see ``swebench.harness.constants`` and the dataset card of
``princeton-nlp/SWE-bench``). The remaining fields say how to run the instance anywhere.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandlot.sandboxes.environment import EnvironmentRecipe

DEFAULT_LOG_PARSER = "parse_log_pytest"
DEFAULT_EVAL_TIMEOUT_S = 1800.0
DEFAULT_IMAGE_KEY = "default"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# git's scp-like remote syntax: a colon before any slash ("git@github.com:owner/repo.git").
_SCP_LIKE = re.compile(r"^[^/]*:")


def is_remote_source(repo_source: str) -> bool:
    """``True`` for URLs (``https://``, ``file://``, ...) and scp-like remotes (``git@host:x``);
    ``False`` for host paths."""
    return bool(_URL.match(repo_source) or _SCP_LIKE.match(repo_source))


def _as_test_list(value: Any, field: str) -> list[str]:
    """Accept a list of test ids or a JSON string holding one (the HF datasets store strings)."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{field} is a string but not valid JSON ({exc.msg} at char {exc.pos}); "
                f"give a list of test ids or a JSON-encoded list"
            ) from exc
    if hasattr(value, "tolist"):  # numpy arrays coming out of parquet readers
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{field} must be a list of test id strings, got {type(value).__name__}")
    return list(value)


_NEW_FILE = re.compile(r"^--- /dev/null\n\+\+\+ b/(.+)$", re.MULTILINE)


def created_files(test_patch: str) -> list[str]:
    """The files a unified diff creates (``--- /dev/null`` then ``+++ b/<path>``), in order."""
    return _NEW_FILE.findall(test_patch)


class Instance(BaseModel):
    """An SWE-bench style instance.

    Attributes:
        instance_id: unique id, e.g. ``"astropy__astropy-12907"``.
        repo: ``"owner/name"``; selects the ``swebench`` log parser and test command by default.
        base_commit: commit the model's patch applies to.
        patch: the gold patch (used for ``--predictions gold``).
        test_patch: the patch adding/updating the tests that grade the instance.
        FAIL_TO_PASS: tests that must go from failing to passing.
        PASS_TO_PASS: tests that must keep passing.
        version: the repo version key of the ``swebench`` specifications.
        problem_statement: the issue text shown to the agent.
        image: sandbox image: ``"host"`` or a rootfs path for ``local``, an image name for the
            container backends; or a mapping from backend name (or ``"default"``) to image,
            ``{"local": "host", "docker": "python:3.12"}``, so one row runs on every backend
            (see :meth:`image_for`).
        environment: the test environment the instance needs (``python``, ``pip_packages``,
            ``requirements``, ``pre_install``, ``install``, as in SWE-bench's specs); ``None``
            means the image provides it (on ``local``, swebench's spec for ``repo`` +
            ``version`` is used when there is one).
        repo_source: where to get the repo when the image does not hold it: a git URL (cloned
            inside the sandbox) or a host path to a repository or mirror (uploaded). Relative
            paths are resolved against the dataset file by the loaders.
        post_setup_cmd: environment setup run in ``workdir`` once the repo is in place.
        workdir: the repository's directory inside the sandbox.
        env: environment variables for setup and tests.
        test_cmd: the command that runs the tests; derived from ``swebench`` specs when absent.
        log_parser: name of a ``swebench.harness.log_parsers`` function (``parse_log_pytest``).
        eval_timeout: limit for running the tests, in seconds.
        graded_paths: where the environment holds what grades the instance (hidden tests,
            their runner, expected outputs), absolute or relative to ``workdir``; filled by
            each dataset's converter (R2E-Gym: :data:`sandlot.datasets.r2e_gym.GRADED_PATHS`).
            The agent's sandbox deletes them, with the files ``test_patch`` creates, before
            the model's first turn (:meth:`graded_artefacts`); the evaluation's fresh sandbox
            keeps them.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = ""
    base_commit: str = Field(min_length=1)
    patch: str = ""
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str | None = None
    problem_statement: str = ""
    image: str | dict[str, str] = "host"
    environment: EnvironmentRecipe | None = None
    repo_source: str | None = None
    post_setup_cmd: str | None = None
    workdir: str = "/testbed"
    env: dict[str, str] = Field(default_factory=dict)
    test_cmd: str | None = None
    log_parser: str | None = None
    eval_timeout: float = Field(default=DEFAULT_EVAL_TIMEOUT_S, gt=0)
    graded_paths: list[str] = Field(default_factory=list)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _parse_test_lists(cls, value: Any, info: Any) -> list[str]:
        return _as_test_list(value, info.field_name)

    @field_validator("image")
    @classmethod
    def _image_names(cls, value: str | dict[str, str]) -> str | dict[str, str]:
        names = value.values() if isinstance(value, dict) else [value]
        if not value or not all(n.strip() for n in names):
            raise ValueError("image must be a non-empty name or a non-empty {backend: name} map")
        return value

    @field_validator("graded_paths", mode="before")
    @classmethod
    def _graded_paths(cls, value: Any) -> Any:
        if value is None:
            return []
        if hasattr(value, "tolist"):  # numpy arrays coming out of parquet readers
            value = value.tolist()
        if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
            return value  # pydantic names the type error
        for path in value:
            if (
                not path.strip()
                or posixpath.normpath(path) in ("/", "//", ".")
                or (".." in path.split("/"))
            ):
                raise ValueError(
                    f"graded_paths: {path!r} is not a file or directory below '/' or the "
                    "workdir (the agent's sandbox deletes each one)"
                )
        return list(value)

    def graded_artefacts(self) -> list[str]:
        """Absolute paths that must not exist in the agent's sandbox: :attr:`graded_paths`
        (relative ones joined to ``workdir``) and the files ``test_patch`` creates, in order,
        without duplicates."""
        paths = [*self.graded_paths, *created_files(self.test_patch)]
        found: list[str] = []
        for path in paths:
            full = posixpath.normpath(posixpath.join(self.workdir, path))
            if full not in found and full != posixpath.normpath(self.workdir):
                found.append(full)
        return found

    def image_for(self, backend: str) -> str:
        """The image this instance runs in on ``backend``.

        Raises:
            ValueError: ``image`` is a mapping with neither ``backend`` nor ``"default"``
                (the message lists the backends it has and says to pass ``--image``).
        """
        if isinstance(self.image, str):
            return self.image
        found = self.image.get(backend) or self.image.get(DEFAULT_IMAGE_KEY)
        if found is None:
            raise ValueError(
                f"instance {self.instance_id!r} names images for {', '.join(sorted(self.image))} "
                f"but not for backend {backend!r}; add a {backend!r} (or 'default') entry to its "
                "image map, or pass --image"
            )
        return found

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_str(cls, value: Any) -> Any:
        # HF rows carry versions like 3.0 as floats in some exports; specs key them as "3.0".
        return str(value) if isinstance(value, int | float) else value
