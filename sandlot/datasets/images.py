"""Image names per backend: the one place that says which image runs which instance where.

A *backend* (``$DEPLOYMENT``) is where the sandboxes of a dataset run: ``local``, ``docker``,
``modal`` or ``vefaas``. The container backends take their names from the table of image
families and backends in :mod:`sandlot.sandboxes.images` (:data:`IMAGE_TEMPLATES`, shared with
the backends); :func:`image_name` fills it in for one instance. ``local`` runs on the host (image
``"host"``) with the repository cloned from a mirror directory (see ``sandlot.datasets.local``),
for every family.

An override map (``instance_id → image``, a JSON or YAML object, see
:func:`sandlot.sandboxes.images.load_image_overrides`) replaces the computed name of the instances
it lists.

:data:`IMAGE_PATH` is the ``PATH`` under which a family's images run their tests: the SWE-bench
harness activates the conda environment ``testbed`` of ``/opt/miniconda3`` before every test run
(``swebench.harness.test_spec.python.make_eval_script_list_py``); R2E-Gym runs with its
``/root/.venv`` first (``r2egym.agenthub.runtime.docker.DOCKER_PATH``). Putting that ``PATH`` in a
row's environment gives the agent and the tests the same interpreter without a login shell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from sandlot.datasets.errors import DatasetMessageError
from sandlot.sandboxes.images import IMAGE_TEMPLATES, ImageFamily, image_key

ImageBackend = Literal["local", "docker", "modal", "vefaas"]
"""The backends the preprocessors name images for (:data:`IMAGE_TEMPLATES`, and ``local``'s
host). A row itself may name any registered backend (``sandlot.sandboxes.registry``)."""

IMAGE_BACKENDS: tuple[ImageBackend, ...] = get_args(ImageBackend)
DEFAULT_ROW_BACKEND: ImageBackend = "docker"
"""The backend of prepared rows when neither ``--backend`` nor the environment names one
(:func:`~sandlot.sandboxes.registry.choose_backend`'s ``default``): real SWE rows run in their
per-instance images. (``sandlot.open`` and ``sandlot eval`` default to the ``local`` backend,
which needs no daemon; they run a prepared row on the backend its ``sandbox.backend`` names.)"""
LOCAL_IMAGE = "host"
"""The image of ``local`` rows: the host's root, read-only, inside a bubblewrap jail."""

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_PATH: dict[ImageFamily, str] = {
    ImageFamily.SWE_BENCH: f"/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:{_SYSTEM_PATH}",
    ImageFamily.SWE_REBENCH: f"/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:{_SYSTEM_PATH}",
    ImageFamily.R2E_GYM: f"/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:{_SYSTEM_PATH}",
}
"""``PATH`` of the test environment inside each family's images."""


class ImageNameError(DatasetMessageError):
    """An image name cannot be built for an instance (a template field is missing)."""


def image_name(
    family: ImageFamily,
    instance_id: str,
    backend: ImageBackend,
    *,
    source_image: str | None = None,
    commit: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> str:
    """The image that runs ``instance_id`` of ``family`` on ``backend``.

    Args:
        family: the dataset's image family.
        instance_id: the instance; an entry for it in ``overrides`` wins over the table.
        backend: ``local`` gives :data:`LOCAL_IMAGE`; the others use
            :data:`~sandlot.sandboxes.images.IMAGE_TEMPLATES`.
        source_image: the image the source row names (``{source_image}``).
        commit: the instance's commit hash (``{commit10}``).
        overrides: ``instance_id → image``.

    Raises:
        ImageNameError: the template needs ``source_image`` or ``commit`` and it is missing.
    """
    if overrides and instance_id in overrides:
        return overrides[instance_id]
    if backend == "local":
        return LOCAL_IMAGE
    template = IMAGE_TEMPLATES[family][backend]
    if "{source_image}" in template and not source_image:
        raise ImageNameError(
            f"{instance_id}: {family.value} images on {backend} are named by the source row's "
            "docker_image, which is empty; add it to the row or to the image override map"
        )
    if "{commit10}" in template and not commit:
        raise ImageNameError(f"{instance_id}: {family.value} images on {backend} need a commit")
    return template.format(
        key=image_key(instance_id), source_image=source_image or "", commit10=(commit or "")[:10]
    )
