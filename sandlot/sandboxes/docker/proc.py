"""``/proc`` read-only for the container outside the processes' own directories.

A mode set on a top-level ``/proc`` entry (``chmod 440 /proc/buddyinfo``, by container root, its
owner) is kept by the kernel in the entry itself, so every later container of the engine host
sees it. The engine's defaults leave all but a few entries writable (docs/docker.md, "What a
command cannot touch"); this module adds the fields that make them read-only to the container's
``HostConfig``, by engine:

* Docker Engine: ``HostConfig.ReadonlyPaths`` (the daemon fills it in from moby's
  ``DefaultLinuxSpec`` when it is not given; a list given replaces the default one, so that
  one is repeated here) with every top-level entry of :data:`PROC_ENTRIES`; the runtime
  binds each read-only on itself and skips the ones this kernel lacks. The processes'
  directories stay writable (``/proc/self/oom_score_adj``, ``attr/``).
* Podman: its Docker API ignores ``ReadonlyPaths`` (``pkg/api/handlers/compat``), so the
  whole ``/proc`` mount is made read-only with ``SecurityOpt`` ``proc-opts`` (its default
  options, ``nosuid,noexec,nodev``, plus ``ro``): the processes' directories are read-only
  too. Not on a Podman that reports SELinux or AppArmor: the runtime writes each new
  process's label under ``/proc/self/attr`` in the container (runc 1.1 does), which a
  read-only ``/proc`` refuses; there ``/proc`` is left as Podman mounts it (logged once).

The docker SDK's ``create_host_config`` has no keyword for either field; its result is the
request's ``HostConfig`` dict, so they are added to it (:func:`read_only_proc`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sandlot.sandboxes.docker")

DOCKER_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
"""moby's default ``ReadonlyPaths`` (``daemon/pkg/oci/defaults.go``)."""

# Measured: `ls -la /proc` in a container of the CI engine (Podman 4.3.1, runc 1.1.5, kernel
# 6.18), less the PID directories and the symlinks into them (self, thread-self, mounts, net).
_MEASURED = """acpi buddyinfo bus cgroups cmdline config.gz consoles cpuinfo crypto devices
diskstats dma driver execdomains filesystems fs interrupts iomem ioports irq kallsyms key-users
keys kmsg kpagecgroup kpagecount kpageflags loadavg locks meminfo misc mtrr pagetypeinfo
partitions pressure slabinfo softirqs stat swaps sys sysvipc timer_list tty uptime version
vmallocinfo vmstat zoneinfo"""
# Other kernels' and configurations' top-level entries (Docker's masked ones included: the
# masks are mounted after, over the read-only binds).
_ELSEWHERE = """allocinfo asound bootconfig dynamic_debug fb kcore latency_stats lockdep
lockdep_chains lockdep_stats mdstat modules mpt sched_debug schedstat scsi spl sysrq-trigger
timer_stats version_signature vmcore xen"""

PROC_ENTRIES = tuple(sorted({*_MEASURED.split(), *_ELSEWHERE.split()}))
"""Top-level ``/proc`` entries that describe the machine (not a process) made read-only on a
Docker Engine. One a module adds under another name stays as the engine leaves it."""

# Podman's default /proc mount options, plus ro (proc-opts replaces the list).
_PODMAN_PROC_OPTS = "proc-opts=ro,nosuid,noexec,nodev"
_LABELLING = ("name=selinux", "name=apparmor")

# By client: one per engine address (engine.get_client), kept for the process.
_by_client: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def read_only_proc(api: Any) -> dict[str, Any]:
    """The ``HostConfig`` fields that make ``/proc`` read-only on the engine of ``api`` (an
    ``APIClient``), asked once per client (``GET /version``, and ``GET /info`` on Podman).
    Blocking."""
    with _lock:
        if (fields := _by_client.get(api)) is None:
            fields = _by_client[api] = proc_fields(api.version(), api.info)
    return fields


def proc_fields(version: dict[str, Any], info: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The fields for an engine whose ``GET /version`` answered ``version``; ``info`` gives
    its ``GET /info`` (asked only of Podman)."""
    components = version.get("Components") or []
    if not any(str(c.get("Name", "")).startswith("Podman") for c in components):
        entries = [f"/proc/{name}" for name in PROC_ENTRIES]
        return {"ReadonlyPaths": sorted({*DOCKER_READONLY_PATHS, *entries})}
    security = info().get("SecurityOptions") or []
    if labelling := [o for o in security if str(o).startswith(_LABELLING)]:
        log.warning(
            "Podman reports %s: /proc is left writable as Podman mounts it (a read-only /proc "
            "would refuse the runtime's label writes); see docs/docker.md",
            ", ".join(labelling),
        )
        return {}
    return {"SecurityOpt": [_PODMAN_PROC_OPTS]}
