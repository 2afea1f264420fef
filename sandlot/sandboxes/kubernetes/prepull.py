"""Pre-pulling a dataset's images on every node: DaemonSets whose init containers are the
images (each runs ``true`` and leaves its image on the node), as rLLM/DeepSWE does, so that a
sandbox's pod starts without a pull (``imagePullPolicy: IfNotPresent``).

``sandlot image prepull --backend kubernetes --dataset FILE`` writes them (YAML) or, with
``--apply``, creates them (an existing one of the same name is replaced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandlot.errors import SandboxError
from sandlot.sandboxes.kubernetes.client import api_message, cluster, k8s, new_client, status_of
from sandlot.sandboxes.kubernetes.manifest import MANAGED_BY
from sandlot.sandboxes.kubernetes.options import KubernetesOptions

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
"""What each pre-pull pod runs once its init containers pulled the images: nothing, cheaply."""
PER_DAEMONSET = 100
"""Images per DaemonSet (init containers run one after another; a pod spec stays small)."""


def prepull_daemonsets(
    images: Sequence[str],
    options: KubernetesOptions,
    *,
    name: str = "sandlot-prepull",
    per_daemonset: int = PER_DAEMONSET,
) -> list[dict[str, Any]]:
    """The DaemonSets pulling ``images`` on every node ``options`` schedules sandboxes on.

    Args:
        images: image references, as the cluster pulls them.
        options: ``namespace``, ``node_selector``, ``tolerations``, ``image_pull_secrets`` and
            ``runtime_class_name`` are those of the sandboxes', so the images land where
            sandboxes run.
        name: the DaemonSets' name (``-0``, ``-1``... appended when there are several).
        per_daemonset: images per DaemonSet.

    Returns:
        ``apps/v1`` DaemonSet manifests; each init container requests little (10m CPU, 32 MiB)
        and runs ``/bin/sh -c true`` (an image without ``/bin/sh`` fails its init container,
        after the pull that is the point).
    """
    chunks = [images[i : i + per_daemonset] for i in range(0, len(images), per_daemonset)]

    def small() -> dict[str, Any]:  # a fresh dict each time: no YAML anchors in the output
        return {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}

    sets = []
    for n, chunk in enumerate(chunks):
        set_name = name if len(chunks) == 1 else f"{name}-{n}"
        labels = {"app": set_name, MANAGED_BY: "sandlot"}
        pod_spec: dict[str, Any] = {
            "initContainers": [
                {
                    "name": f"image-{i}",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", "true"],
                    "resources": small(),
                }
                for i, image in enumerate(chunk)
            ],
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "resources": small()}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        }
        if options.node_selector:
            pod_spec["nodeSelector"] = dict(options.node_selector)
        if options.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in options.tolerations]
        if options.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
        if options.runtime_class_name:
            pod_spec["runtimeClassName"] = options.runtime_class_name
        sets.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": set_name, "labels": dict(labels)},
                "spec": {
                    "selector": {"matchLabels": {"app": set_name}},
                    "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
                },
            }
        )
    return sets


async def apply_daemonsets(sets: Sequence[dict[str, Any]], options: KubernetesOptions) -> str:
    """Create ``sets`` in the namespace of ``options`` (one that exists is replaced); the
    namespace.

    Raises:
        BackendUnavailableError: no client or no kubeconfig.
        SandboxError: the API refused (the message names the DaemonSet and the server's
            reason: a 403 needs the RBAC rule of docs/kubernetes.md).
    """
    sdk = k8s()
    where = await cluster(options)
    async with new_client(where.config) as api:
        apps = sdk.client.AppsV1Api(api)
        for manifest in sets:
            set_name = manifest["metadata"]["name"]
            try:
                try:
                    await apps.create_namespaced_daemon_set(where.namespace, manifest)
                except sdk.client.exceptions.ApiException as exc:
                    if exc.status != 409:
                        raise
                    await apps.replace_namespaced_daemon_set(set_name, where.namespace, manifest)
            except sdk.client.exceptions.ApiException as exc:
                raise SandboxError(
                    f"DaemonSet {set_name} in namespace {where.namespace}: {api_message(exc)}",
                    retryable=status_of(exc) in (429, 500, 502, 503, 504),
                ) from exc
    return where.namespace
