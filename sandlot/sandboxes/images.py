"""Image names per backend: canonical image name → the name a backend pulls it by.

Datasets name their images canonically, as Docker Hub publishes them:

* SWE-bench: ``swebench/sweb.eval.x86_64.<key>[:tag]``
* SWE-rebench: ``swerebench/sweb.eval.x86_64.<key>[:tag]``
* R2E-Gym: ``namanjain12/<repo>_final:<commit>``

``<key>`` is :func:`image_key` of the instance id (lower-cased, ``__`` → ``_1776_``). An *image
family* is the set of per-instance images published for one dataset. :data:`IMAGE_TEMPLATES`
is the one table of names per family and backend, used both by dataset preparation
(:func:`sandlot.datasets.images.image_name`) and by the backends (:func:`backend_image`);
``{key}`` is :func:`image_key`, ``{commit10}`` the first 10 characters of an R2E-Gym commit,
``{source_image}`` the image named by the source row itself:

* ``docker`` and ``modal``: the canonical Docker Hub names (Modal pulls with
  ``Image.from_registry``):

  - ``swe-bench``: ``swebench/sweb.eval.x86_64.{key}:latest``
  - ``swe-rebench``: ``swerebench/sweb.eval.x86_64.{key}``
  - ``r2e-gym``: ``{source_image}`` (the row's ``docker_image``)

* ``vefaas``: the mirrors on the Volcengine registry,

  - ``swe-bench``: ``enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/``
    ``sweb.eval.x86_64.{key}:v2``
  - ``swe-rebench``: ``enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/{key}:latest``
  - ``r2e-gym``: ``enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/{commit10}:latest``

Sources: the Docker Hub names follow ``swebench.harness.test_spec.TestSpec.instance_image_key``
(swebench 4.1: ``sweb.eval.<arch>.<instance_id lower>``, namespace ``swebench``, ``__`` →
``_1776_``) and SWE-rebench's published ``swerebench/`` images (as named by uni-agent's
``examples/data_preprocess/swe_rebench.py``); the veFaaS registry names are those of
verl-project/uni-agent (``PUB_VOLCES_IMG_URL_TEMPLATE`` in
``uni_agent/deployment/vefaas/deployment.py`` and
``examples/data_preprocess/r2e_gym_subset_filtered.py``).

:func:`backend_image` parses a canonical *name* and applies the table; a name that is not
canonical (a private registry, ``python:3.12``) is passed through. Overrides (canonical name →
backend name) win over the table: the backend's ``image_overrides`` option, then the JSON/YAML
file named by ``$SANDLOT_IMAGE_OVERRIDES`` (read by :func:`load_image_overrides`, which also
reads the datasets' ``instance_id → image`` maps).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Literal

import yaml

from sandlot.settings import settings

RegistryBackend = Literal["docker", "modal", "vefaas"]
"""The backends that pull per-instance images from a registry (``local`` runs on the host)."""


class ImageFamily(str, Enum):
    """A set of per-instance images published for one dataset."""

    SWE_BENCH = "swe-bench"
    SWE_REBENCH = "swe-rebench"
    R2E_GYM = "r2e-gym"


IMAGE_TEMPLATES: dict[ImageFamily, dict[RegistryBackend, str]] = {
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
"""Name templates per family and registry backend."""

_SWE = re.compile(r"^(?P<ns>swebench|swerebench)/sweb\.eval\.x86_64\.(?P<key>[^:/]+)(?::[^/]+)?$")
_R2E = re.compile(r"^namanjain12/[^:/]+_final:(?P<commit>[0-9a-f]{10,40})$")
_NAMESPACE_FAMILY = {"swebench": ImageFamily.SWE_BENCH, "swerebench": ImageFamily.SWE_REBENCH}


def image_key(instance_id: str) -> str:
    """``"astropy__astropy-12907"`` → ``"astropy_1776_astropy-12907"`` (Docker Hub safe)."""
    return instance_id.lower().replace("__", "_1776_")


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


def env_overrides() -> dict[str, str]:
    """The override map in the file named by ``$SANDLOT_IMAGE_OVERRIDES`` (empty if unset).

    Raises:
        FileNotFoundError: the variable names a missing file.
        ValueError: the file is not a JSON/YAML object of names.
    """
    path = settings().image_overrides
    return load_image_overrides(path) if path else {}


def backend_image(image: str, backend: str, overrides: Mapping[str, str] | None = None) -> str:
    """The name ``backend`` pulls the canonical ``image`` by.

    Args:
        image: canonical (or any) image name.
        backend: ``docker``, ``modal``, ``vefaas``; other backends get ``image`` unchanged.
        overrides: canonical name → backend name; wins over ``$SANDLOT_IMAGE_OVERRIDES`` and
            the table.

    Raises:
        ValueError: ``$SANDLOT_IMAGE_OVERRIDES`` names an invalid file.
    """
    if overrides and image in overrides:
        return overrides[image]
    from_env = env_overrides()
    if image in from_env:
        return from_env[image]
    if backend != "vefaas":
        return image  # docker and modal pull the canonical Docker Hub names themselves
    swe = _SWE.match(image)
    if swe:
        template = IMAGE_TEMPLATES[_NAMESPACE_FAMILY[swe["ns"]]]["vefaas"]
        return template.format(key=swe["key"], source_image=image, commit10="")
    r2e = _R2E.match(image)
    if r2e:
        template = IMAGE_TEMPLATES[ImageFamily.R2E_GYM]["vefaas"]
        return template.format(key="", source_image=image, commit10=r2e["commit"][:10])
    return image
