"""What the ``kubernetes`` backend sends to the API server: a sandbox's pod and the namespace's
deny-all NetworkPolicy, as plain manifests (dicts in the API's JSON shape, which the client
serialises as they are and ``podman kube play`` runs).

Label values may hold only letters, digits, ``-``, ``_`` and ``.`` (63 at most, alphanumeric at
both ends), so ``sandlot.owner`` (``user@host``) and any ``spec.labels`` value that is not a
valid label value travel as annotations; :func:`sandbox_tags` reads both back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sandlot.sandboxes.kubernetes.options import KubernetesOptions
from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.spec import SandboxSpec

CONTAINER = "sandbox"
"""The name of the pod's one container (the exec's ``container`` parameter)."""
NETWORK_LABEL = "sandlot.network"
"""Set to ``none`` on pods of ``network=False``: the deny-all NetworkPolicy selects them."""
DENY_ALL_POLICY = "sandlot-deny-all"
MANAGED_BY = "app.kubernetes.io/managed-by"
# Capabilities a root process in a SWE image needs (own files, git, pip, chown in set-ups);
# the runtime's others (NET_RAW, MKNOD, SYS_CHROOT, SETFCAP, ...) are dropped.
KEPT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
# PID 1 outlives the pod's activeDeadlineSeconds, which the kubelet enforces.
_INIT_MARGIN_S = 60
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def split_tags(tags: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(labels, annotations)`` of ``tags``: every tag is an annotation; those whose key and
    value are valid label syntax are labels too (what a label selector can match)."""
    labels = {k: v for k, v in tags.items() if _LABEL_KEY.match(k) and _LABEL_VALUE.match(v)}
    return labels, dict(tags)


def sandbox_tags(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The tags of a pod as :func:`split_tags` stored them (``metadata`` in the API's JSON)."""
    return {**(metadata.get("labels") or {}), **(metadata.get("annotations") or {})}


def pod_manifest(
    name: str,
    image: str,
    spec: SandboxSpec,
    options: KubernetesOptions,
    tags: Mapping[str, str],
    *,
    offline: bool,
) -> dict[str, Any]:
    """The pod of one sandbox.

    Args:
        name: the pod's name (a DNS label: lower case, digits, ``-``).
        image: the image reference the cluster pulls.
        spec: ``cpu`` (cores) and ``memory_mb`` (MiB) become the container's requests and
            limits (equal: the Guaranteed class when both are set); ``timeout_s`` the pod's
            ``activeDeadlineSeconds`` (rounded up); ``env`` the container's environment.
        options: scheduling (``node_selector``, ``tolerations``, ``runtime_class_name``,
            ``priority_class_name``), pulls (``image_pull_secrets``, ``image_pull_policy``),
            ``delete_grace_s`` and ``ephemeral_storage_mb``.
        tags: the ``sandlot.*`` labels plus ``spec.labels`` (:func:`split_tags`).
        offline: the pod carries :data:`NETWORK_LABEL`, which the deny-all NetworkPolicy
            selects, from its start (``network=False`` unless an environment install needs
            the network first: the label is then patched on after it).

    No service account token is mounted, privilege escalation is off, capabilities are
    dropped but :data:`KEPT_CAPABILITIES`, and the pod is never restarted.
    """
    labels, annotations = split_tags(tags)
    labels[MANAGED_BY] = "sandlot"
    if offline:
        labels[NETWORK_LABEL] = "none"
    lifetime = max(1, math.ceil(spec.timeout_s))
    resources: dict[str, dict[str, str]] = {}
    if spec.cpu is not None:
        cores = f"{math.ceil(spec.cpu * 1000)}m"
        resources.setdefault("requests", {})["cpu"] = cores
        resources.setdefault("limits", {})["cpu"] = cores
    if spec.memory_mb is not None:
        resources.setdefault("requests", {})["memory"] = f"{spec.memory_mb}Mi"
        resources.setdefault("limits", {})["memory"] = f"{spec.memory_mb}Mi"
    if options.ephemeral_storage_mb is not None:
        resources.setdefault("limits", {})["ephemeral-storage"] = (
            f"{options.ephemeral_storage_mb}Mi"
        )
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "command": remote_shell.init_argv(lifetime + _INIT_MARGIN_S),
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": list(KEPT_CAPABILITIES)},
        },
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "activeDeadlineSeconds": lifetime,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": options.delete_grace_s,
    }
    if options.runtime_class_name:
        pod_spec["runtimeClassName"] = options.runtime_class_name
    if options.priority_class_name:
        pod_spec["priorityClassName"] = options.priority_class_name
    if options.node_selector:
        pod_spec["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in options.tolerations]
    if options.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def deny_all_policy() -> dict[str, Any]:
    """The NetworkPolicy that cuts every pod labelled ``sandlot.network=none`` off the network,
    both ways (no ingress or egress rule: nothing is allowed). A cluster whose network plugin
    does not enforce NetworkPolicies (flannel alone, kindnet before 1.31...) accepts it and
    lets the traffic through: docs/kubernetes.md."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_ALL_POLICY, "labels": {MANAGED_BY: "sandlot"}},
        "spec": {
            "podSelector": {"matchLabels": {NETWORK_LABEL: "none"}},
            "policyTypes": ["Ingress", "Egress"],
        },
    }


def run_selector(run_id: str | None) -> str:
    """The label selector of the pods of ``run_id`` (any run's when ``None``)."""
    return f"{RUN_ID}={run_id}" if run_id else RUN_ID
