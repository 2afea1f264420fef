"""Snapshots of the docker backend: a container committed to an image.

Written against the ``docker`` SDK 7.1 ``APIClient.commit`` / ``remove_image`` / ``images``
(https://docker-py.readthedocs.io/en/7.1.0/api.html) and the Engine API v1.41 ``POST /commit``
(https://docs.docker.com/engine/api/v1.41/#operation/ImageCommit), which Podman 4 serves too.
The container is paused while its filesystem is committed; its processes are not in the image.
The image carries the ``sandlot.*`` labels (the snapshot's id as ``sandlot.sandbox_id``, and
``sandlot.snapshot``), which ``sandlot gc --backend docker`` looks for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandlot.sandboxes.docker.engine import get_client, run_blocking, sdk
from sandlot.sandboxes.labels import RUN_ID, sandbox_labels

if TYPE_CHECKING:
    from docker import APIClient

log = logging.getLogger("sandlot.sandboxes.docker")

SNAPSHOT = "sandlot.snapshot"
"""Label of every snapshot image (its value is the snapshot's id)."""


def commit(api: APIClient, container_id: str, labels: Mapping[str, str]) -> str:
    """Commit the container (paused meanwhile) to a new untagged image; return its id.

    Args:
        api: the engine's client.
        container_id: the container.
        labels: the sandbox's ``spec.labels``; the ``sandlot.*`` ones are added.

    Raises:
        docker.errors.APIError: the engine refused.
    """
    name = f"sandlot-snap-{uuid.uuid4().hex[:12]}"
    tagged = {**sandbox_labels(name, labels), SNAPSHOT: name}
    # LABEL instructions (not `conf`, whose labels Podman's compat API ignores); JSON strings
    # are valid Dockerfile quoting.
    changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in tagged.items()]
    result: dict[str, Any] = api.commit(container_id, changes=changes, pause=True)
    image_id = str(result["Id"])  # Podman leaves out the algorithm the image list shows
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


async def remove(image_id: str, base_url: str | None) -> None:
    """Remove the snapshot image; gone already is fine. One still used by a container (of
    another process: this one's forks were counted) stays, with a warning, for ``sandlot gc``.
    """
    api = (await run_blocking(get_client, base_url)).api
    errors = sdk().errors
    try:
        await run_blocking(api.remove_image, image_id)
    except errors.NotFound:
        return
    except errors.APIError as exc:
        if exc.status_code != 409:
            raise
        log.warning(
            "snapshot image %s is still used by a container, left for `sandlot gc`: %s",
            image_id[:19],
            exc.explanation,
        )


def list_snapshots(api: APIClient, run_id: str | None) -> list[dict[str, Any]]:
    """Snapshot images (of run ``run_id`` when given), as the engine lists them."""
    # One label per query: Podman 4 matches nothing for two (Docker requires both).
    rows: list[dict[str, Any]] = api.images(
        filters={"label": f"{RUN_ID}={run_id}" if run_id else SNAPSHOT}
    )
    return [row for row in rows if SNAPSHOT in (row.get("Labels") or {})]


def force_remove(api: APIClient, image_id: str) -> None:
    """Remove the snapshot image even when containers use it (``sandlot gc``)."""
    with contextlib.suppress(sdk().errors.NotFound):
        api.remove_image(image_id, force=True)
