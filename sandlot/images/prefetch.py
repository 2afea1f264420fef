"""Pull images on every node of a Ray cluster: one task per node, pinned to it.

Each node has its own cache (the user's cache directory there), so a training run whose
sandboxes start on any node finds its images already pulled. Ray is imported only here
(``sandlot[train]`` installs it); the tasks ask for no CPU, so they run beside a busy job.
Written against Ray 2.x (``ray.nodes``, ``NodeAffinitySchedulingStrategy``; see
https://docs.ray.io/en/latest/ray-core/scheduling/index.html).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sandlot.errors import BackendUnavailableError, SandboxError
from sandlot.images.pulling import pull


@dataclass(frozen=True)
class NodePrefetch:
    """What one node pulled.

    Attributes:
        node: the node's address (Ray's ``NodeManagerAddress``).
        ready: images now in its cache.
        failed: ``(image, error)`` of the others.
        transferred: bytes of layer blobs it transferred.
        seconds: wall time of its task.
    """

    node: str
    ready: int
    failed: tuple[tuple[str, str], ...]
    transferred: int
    seconds: float


def pull_here(names: list[str], jobs: int, node: str, unpack: bool = True) -> NodePrefetch:
    """Pull ``names`` into this machine's cache, ``jobs`` at a time (unpacked unless
    ``unpack`` is false: see :func:`sandlot.images.pull`)."""
    started = time.monotonic()

    def one(name: str) -> tuple[str, int | str]:
        try:
            return name, pull(name, unpack=unpack).transferred
        except SandboxError as exc:
            return name, str(exc)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = list(pool.map(one, names))
    failed = tuple((n, r) for n, r in outcomes if isinstance(r, str))
    transferred = sum(r for _, r in outcomes if isinstance(r, int))
    return NodePrefetch(
        node, len(names) - len(failed), failed, transferred, time.monotonic() - started
    )


def prefetch_on_cluster(
    names: list[str], jobs: int, address: str = "auto", unpack: bool = True
) -> list[NodePrefetch]:
    """Pull ``names`` (unpacked unless ``unpack`` is false) on every alive node of the Ray
    cluster (joined at ``address`` unless this process is already connected), one task per
    node; their results.

    Raises:
        BackendUnavailableError: Ray is not installed.
    """
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=0)(pull_here)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(names, jobs, node["NodeManagerAddress"], unpack)
        for node in ray.nodes()
        if node["Alive"]
    ]
    results: list[NodePrefetch] = ray.get(refs)
    return results


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BackendUnavailableError(
            "--ray needs Ray: pip install 'sandlot[train]' (or pip install ray)"
        ) from None
    return ray
