"""Reading a pod's status (the API's JSON): is it ready, why can it not start, why did it die.

Start failures are classified (``SandboxStartError.retryable``):

* an image that cannot be pulled (``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``,
  ``ErrImageNeverPull``) or a container the kubelet cannot create (``CreateContainerConfigError``:
  a missing Secret...): not retryable, the image and the kubelet's message named;
* a pod the scheduler cannot place (``PodScheduled=False``, reason ``Unschedulable``) for longer
  than ``unschedulable_timeout_s``: retryable, with the scheduler's message (``0/3 nodes are
  available: 3 Insufficient cpu.``);
* a pod evicted, its node lost or deleted while starting: retryable (another node may do).

After the start, :func:`death` says why a pod can no longer run commands (evicted, node lost,
deadline, deleted, its container ended), which becomes ``SandboxDeadError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandlot.errors import SandboxStartError

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CREATE_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")

Pod = Mapping[str, Any]


def _container(pod: Pod) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _condition(pod: Pod, kind: str) -> Mapping[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


def is_ready(pod: Pod) -> bool:
    """Running, with its ``Ready`` condition true."""
    return (pod.get("status") or {}).get("phase") == "Running" and _condition(pod, "Ready").get(
        "status"
    ) == "True"


def unschedulable(pod: Pod) -> str | None:
    """The scheduler's message when it cannot place the pod, else ``None``."""
    cond = _condition(pod, "PodScheduled")
    if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
        return str(cond.get("message") or "Unschedulable")
    return None


def death(pod: Pod) -> str | None:
    """Why the pod can no longer run commands, else ``None``."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return f"pod {name} is being deleted"
    phase, reason, message = status.get("phase"), status.get("reason"), status.get("message")
    if phase == "Failed":
        if reason == "Evicted":
            return f"pod {name} was evicted: {message or 'no message'}"
        return f"pod {name} failed ({reason or 'no reason'}): {message or 'no message'}"
    if phase == "Succeeded":
        return f"pod {name} ended: its PID 1 exited"
    if phase == "Unknown":
        return f"pod {name}: its node was lost ({reason or 'no reason'}: {message or ''})"
    terminated = (_container(pod).get("state") or {}).get("terminated")
    if terminated:
        return (
            f"pod {name}: its container ended ({terminated.get('reason') or 'no reason'}, "
            f"exit code {terminated.get('exitCode')})"
        )
    return None


def start_failure(pod: Pod, image: str) -> SandboxStartError | None:
    """Why the starting pod will not become ready (see the module docstring), else ``None``;
    an ``Unschedulable`` pod is left to the caller's patience (:func:`unschedulable`)."""
    name = (pod.get("metadata") or {}).get("name", "?")
    waiting = (_container(pod).get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    if reason in PULL_FAILURES:
        return SandboxStartError(
            f"pod {name}: cannot pull image {image!r} ({reason}): {waiting.get('message', '')}",
            retryable=False,
        )
    if reason in CREATE_FAILURES:
        return SandboxStartError(
            f"pod {name}: the kubelet cannot create its container ({reason}): "
            f"{waiting.get('message', '')}",
            retryable=False,
        )
    dead = death(pod)
    if dead is not None:
        return SandboxStartError(f"{dead} while starting", retryable=True)
    return None
