"""``KubernetesOptions``: settings of the ``kubernetes`` backend that ``SandboxSpec`` does not
cover (where the pods go, how they are scheduled, how long the API may take)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sandlot.sandboxes.transport import ExecOptions


class KubernetesOptions(ExecOptions):
    """Options of the ``kubernetes`` backend, with
    :class:`~sandlot.sandboxes.transport.ExecOptions`'s (``max_output_bytes``, ``stop_grace_s``).

    Attributes:
        namespace: the namespace the pods (and the deny-all NetworkPolicy) live in; ``None``:
            the kubeconfig context's namespace, else (in a pod) the pod's own, else
            ``default``, as ``kubectl`` chooses.
        kubeconfig: path of a kubeconfig file; ``None`` reads ``$KUBECONFIG`` or
            ``~/.kube/config``, and inside a pod its service account (in-cluster config).
        context: the kubeconfig context; ``None``: its current context.
        image_overrides: canonical image name → the name the cluster pulls, consulted before
            the built-in table (:mod:`sandlot.sandboxes.images`).
        runtime_class_name: ``spec.runtimeClassName`` (``gvisor``, ``kata``...), or ``None``.
        node_selector: ``spec.nodeSelector`` (e.g. ``{"pool": "sandboxes"}``: a CPU node pool).
        tolerations: ``spec.tolerations``, as in a pod manifest (``key``, ``operator``,
            ``value``, ``effect``).
        image_pull_secrets: names of the ``kubernetes.io/dockerconfigjson`` Secrets of the
            namespace for private registries.
        image_pull_policy: the container's ``imagePullPolicy``; ``IfNotPresent`` uses what a
            pre-pull DaemonSet left on the node (``sandlot image prepull``).
        priority_class_name: ``spec.priorityClassName``, or ``None``.
        ephemeral_storage_mb: the container's ``ephemeral-storage`` limit in MiB, or ``None``.
            The kubelet *evicts* a pod past it (the sandbox dies), it does not make writes
            fail: that is why ``spec.disk_mb``, a budget whose writes fail with ENOSPC, is
            refused on this backend and this option is separate.
        create_timeout_s: seconds one API call (create, get, delete, list) may take.
        ready_timeout_s: seconds a pod may take from its create to Running and ready (image
            pull included); past it the start fails, retryable.
        unschedulable_timeout_s: seconds a pod the scheduler cannot place may stay Pending
            (a cluster autoscaler may be adding a node) before the start fails, retryable,
            with the scheduler's message.
        delete_grace_s: ``gracePeriodSeconds`` of the pod's delete (its PID 1 stops at once on
            SIGTERM, so this is only a bound).
        watch_timeout_s: ``timeoutSeconds`` of one watch of a starting pod; a watch that ends
            or drops is followed by a read and a new watch from the read's
            ``resourceVersion``.
    """

    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    image_overrides: dict[str, str] = Field(default_factory=dict)
    runtime_class_name: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    image_pull_secrets: list[str] = Field(default_factory=list)
    image_pull_policy: str = Field(default="IfNotPresent", pattern="^(Always|IfNotPresent|Never)$")
    priority_class_name: str | None = None
    ephemeral_storage_mb: int | None = Field(default=None, gt=0)
    create_timeout_s: float = Field(default=30.0, gt=0)
    ready_timeout_s: float = Field(default=900.0, gt=0)
    unschedulable_timeout_s: float = Field(default=120.0, ge=0)
    delete_grace_s: int = Field(default=5, ge=0)
    watch_timeout_s: int = Field(default=60, gt=0)
