"""Image names per deployment: the one place that says which image runs which instance where.

A *deployment* (``$DEPLOYMENT``) is where the sandboxes of a dataset run: ``local``, ``docker``,
``modal`` or ``vefaas``. An *image family* is a set of per-instance images published for one
dataset. Names are built from templates; ``{key}`` is :func:`image_key` of the instance id,
``{commit10}`` the first 10 characters of an R2E-Gym commit, ``{source_image}`` the image named
by the source row itself.

Templates (:data:`IMAGE_TEMPLATES`), ``docker`` and ``modal`` use the same public names:

- ``swe-bench``: ``swebench/sweb.eval.x86_64.{key}:latest``; vefaas:
  ``enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/sweb.eval.x86_64.{key}:v2``
- ``swe-rebench``: ``swerebench/sweb.eval.x86_64.{key}``; vefaas:
  ``enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/{key}:latest``
- ``r2e-gym``: ``{source_image}`` (the row's ``docker_image``); vefaas:
  ``enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/{commit10}:latest``

``local`` runs on the host (image ``"host"``) with the repository cloned from a mirror directory
(see ``sandlot.datasets.local``), for every family.

Sources: the Docker Hub names follow ``swebench.harness.test_spec.TestSpec.instance_image_key``
(swebench 4.1: ``sweb.eval.<arch>.<instance_id lower>``, namespace ``swebench``, ``__`` →
``_1776_``) and SWE-rebench's published ``swerebench/`` images (as named by uni-agent's
``examples/data_preprocess/swe_rebench.py``); the veFaaS registry names are those of
verl-project/uni-agent (``PUB_VOLCES_IMG_URL_TEMPLATE`` in
``uni_agent/deployment/vefaas/deployment.py`` and
``examples/data_preprocess/r2e_gym_subset_filtered.py``).

An override map (``instance_id → image``, a JSON or YAML object, see
:func:`load_image_overrides`) replaces the computed name of the instances it lists.

:data:`IMAGE_PATH` is the ``PATH`` under which a family's images run their tests: the SWE-bench
harness activates the conda environment ``testbed`` of ``/opt/miniconda3`` before every test run
(``swebench.harness.test_spec.python.make_eval_script_list_py``); R2E-Gym runs with its
``/root/.venv`` first (``r2egym.agenthub.runtime.docker.DOCKER_PATH``). Putting that ``PATH`` in a
row's environment gives the agent and the tests the same interpreter without a login shell.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Literal, get_args

import yaml

Deployment = Literal["local", "docker", "modal", "vefaas"]
"""Where the sandboxes of a prepared dataset run."""

DEPLOYMENTS: tuple[Deployment, ...] = get_args(Deployment)
DEPLOYMENT_ENV = "DEPLOYMENT"
LOCAL_IMAGE = "host"
"""The image of ``local`` rows: the host's root, read-only, inside a bubblewrap jail."""


class ImageFamily(str, Enum):
    """A set of per-instance images published for one dataset."""

    SWE_BENCH = "swe-bench"
    SWE_REBENCH = "swe-rebench"
    R2E_GYM = "r2e-gym"


IMAGE_TEMPLATES: dict[ImageFamily, dict[Deployment, str]] = {
    ImageFamily.SWE_BENCH: {
        "docker": "swebench/sweb.eval.x86_64.{key}:latest",
        "modal": "swebench/sweb.eval.x86_64.{key}:latest",
        "vefaas": "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/"
        "sweb.eval.x86_64.{key}:v2",
    },
    ImageFamily.SWE_REBENCH: {
        "docker": "swerebench/sweb.eval.x86_64.{key}",
        "modal": "swerebench/sweb.eval.x86_64.{key}",
        "vefaas": "enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/{key}:latest",
    },
    ImageFamily.R2E_GYM: {
        "docker": "{source_image}",
        "modal": "{source_image}",
        "vefaas": "enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/{commit10}:latest",
    },
}
"""Name templates per family and container deployment (``local`` always uses ``"host"``)."""

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_PATH: dict[ImageFamily, str] = {
    ImageFamily.SWE_BENCH: f"/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:{_SYSTEM_PATH}",
    ImageFamily.SWE_REBENCH: f"/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:{_SYSTEM_PATH}",
    ImageFamily.R2E_GYM: f"/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:{_SYSTEM_PATH}",
}
"""``PATH`` of the test environment inside each family's images."""


class UnknownDeploymentError(ValueError):
    """``DEPLOYMENT`` names no known deployment."""


class ImageNameError(ValueError):
    """An image name cannot be built for an instance (a template field is missing)."""


def resolve_deployment(value: str | None = None) -> Deployment:
    """Return ``value``, else ``$DEPLOYMENT``, else ``"docker"``, checked and lower-cased.

    Raises:
        UnknownDeploymentError: the name is not one of :data:`DEPLOYMENTS`; the message lists
            them.
    """
    raw = value if value is not None else os.environ.get(DEPLOYMENT_ENV) or "docker"
    name = raw.strip().lower()
    for known in DEPLOYMENTS:
        if name == known:
            return known
    raise UnknownDeploymentError(
        f"unknown deployment {raw!r}; set {DEPLOYMENT_ENV} (or --deployment) to one of: "
        f"{', '.join(DEPLOYMENTS)}"
    )


def image_key(instance_id: str) -> str:
    """``"astropy__astropy-12907"`` → ``"astropy_1776_astropy-12907"`` (Docker Hub safe)."""
    return instance_id.lower().replace("__", "_1776_")


def image_name(
    family: ImageFamily,
    instance_id: str,
    deployment: Deployment,
    *,
    source_image: str | None = None,
    commit: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> str:
    """The image that runs ``instance_id`` of ``family`` on ``deployment``.

    Args:
        family: the dataset's image family.
        instance_id: the instance; an entry for it in ``overrides`` wins over the table.
        deployment: ``local`` gives :data:`LOCAL_IMAGE`; the others use :data:`IMAGE_TEMPLATES`.
        source_image: the image the source row names (``{source_image}``).
        commit: the instance's commit hash (``{commit10}``).
        overrides: ``instance_id → image``.

    Raises:
        ImageNameError: the template needs ``source_image`` or ``commit`` and it is missing.
    """
    if overrides and instance_id in overrides:
        return overrides[instance_id]
    if deployment == "local":
        return LOCAL_IMAGE
    template = IMAGE_TEMPLATES[family][deployment]
    if "{source_image}" in template and not source_image:
        raise ImageNameError(
            f"{instance_id}: {family.value} images on {deployment} are named by the source row's "
            "docker_image, which is empty; add it to the row or to the image override map"
        )
    if "{commit10}" in template and not commit:
        raise ImageNameError(f"{instance_id}: {family.value} images on {deployment} need a commit")
    return template.format(
        key=image_key(instance_id), source_image=source_image or "", commit10=(commit or "")[:10]
    )


def load_image_overrides(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read an override map: a JSON or YAML object ``{"<instance_id>": "<image>", ...}``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not an object of non-empty strings (the message names the file).
    """
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{file}: not valid JSON/YAML ({exc})") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        raise ValueError(f"{file}: an image override map must map instance ids to image names")
    return data
