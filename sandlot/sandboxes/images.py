"""Canonical image name → the name a backend pulls it by.

Datasets name their images canonically, as Docker Hub publishes them:

* SWE-bench: ``swebench/sweb.eval.x86_64.<key>[:tag]``
* SWE-rebench: ``swerebench/sweb.eval.x86_64.<key>[:tag]``
* R2E-Gym: ``namanjain12/<repo>_final:<commit>``

``<key>`` is the instance id lower-cased with ``__`` → ``_1776_``. The table itself lives in
:data:`sandlot.datasets.images.IMAGE_TEMPLATES` (one table for dataset preparation and for the
backends); this module parses a canonical *name* and applies it:

* ``docker`` and ``modal``: unchanged (Docker Hub; Modal pulls with ``Image.from_registry``).
* ``vefaas``: the mirrors on the Volcengine registry,

  - SWE-bench: ``enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/``
    ``sweb.eval.x86_64.<key>:v2``
  - SWE-rebench: ``enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/<key>:latest``
  - R2E-Gym: ``enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/<commit[:10]>:latest``

A name that is not canonical (a private registry, ``python:3.12``) is passed through. Overrides
(canonical name → backend name) win over the table: the backend's ``image_overrides`` option,
then the JSON/YAML file named by ``$SANDLOT_IMAGE_OVERRIDES``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sandlot.datasets.images import IMAGE_TEMPLATES, ImageFamily, load_image_overrides

OVERRIDES_ENV = "SANDLOT_IMAGE_OVERRIDES"

_SWE = re.compile(r"^(?P<ns>swebench|swerebench)/sweb\.eval\.x86_64\.(?P<key>[^:/]+)(?::[^/]+)?$")
_R2E = re.compile(r"^namanjain12/[^:/]+_final:(?P<commit>[0-9a-f]{10,40})$")
_NAMESPACE_FAMILY = {"swebench": ImageFamily.SWE_BENCH, "swerebench": ImageFamily.SWE_REBENCH}


def env_overrides() -> dict[str, str]:
    """The override map in the file named by ``$SANDLOT_IMAGE_OVERRIDES`` (empty if unset).

    Raises:
        FileNotFoundError: the variable names a missing file.
        ValueError: the file is not a JSON/YAML object of names.
    """
    path = os.environ.get(OVERRIDES_ENV)
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
