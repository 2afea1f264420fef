"""The pod manifest the ``kubernetes`` backend emits, run for real by ``podman kube play``: its
container starts from it, and the limits, the environment, the dropped capabilities and the
no-new-privileges bit are read back from inside (the cgroup files, ``/proc/1/status``).

One change is made to the manifest: podman 4.3's ``kube play`` cuts a line at ``#`` before
parsing ("unable to sort kube kinds: ... did not find expected '-' indicator"), and the init
script of ``remote_shell.INIT_SCRIPT`` has ``${d#/proc/}``; the container's ``command`` is
replaced by an init without ``#`` (trap TERM, sleep, wait), everything else is as emitted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from requirements import TEST_IMAGE, docker_engine_missing, need

from sandlot import SandboxSpec
from sandlot.sandboxes.kubernetes import KubernetesOptions
from sandlot.sandboxes.kubernetes.manifest import CONTAINER, KEPT_CAPABILITIES, pod_manifest

pytestmark = pytest.mark.slow
# Linux capability numbers (include/uapi/linux/capability.h).
_CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
             "SETUID": 7}  # fmt: skip


def _podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def played(tmp_path: Path) -> Iterator[str]:
    """The container ``podman kube play`` made from the emitted manifest."""
    need(shutil.which("podman") is not None, "the podman CLI is not installed")
    reason = docker_engine_missing()
    need(reason is None, str(reason))
    name = f"sandlot-kubeplay-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(cpu=0.5, memory_mb=256, timeout_s=300, env={"SANDLOT_PLAYED": "yes"})
    manifest = pod_manifest(
        name, TEST_IMAGE, spec, KubernetesOptions(), {"sandlot.run_id": "kube-play"}, offline=True
    )
    (container,) = manifest["spec"]["containers"]
    container["command"] = ["/bin/sh", "-c", 'trap "exit 0" TERM; sleep "$0" & wait', "300"]
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(manifest))
    result = _podman("kube", "play", str(path))
    try:
        assert result.returncode == 0, result.stderr
        yield f"{name}-{CONTAINER}"
    finally:
        _podman("kube", "down", str(path))


def _in(container: str, script: str) -> str:
    result = _podman("exec", container, "/bin/sh", "-c", script)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


# The container's own cgroup files, v2 or else v1: memory limit, then CPU quota and period.
_LIMITS = """
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max
else
  cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us \\
      /sys/fs/cgroup/cpu/cpu.cfs_period_us
fi
"""


def test_kube_play_runs_the_pod_with_its_limits(played: str) -> None:
    memory, quota, period = _in(played, _LIMITS).split()
    assert int(memory) == 256 * 1024 * 1024
    assert int(quota) / int(period) == 0.5
    assert _in(played, "echo $SANDLOT_PLAYED") == "yes"
    status = dict(line.split(":\t", 1) for line in _in(played, "cat /proc/1/status").splitlines())
    assert status["NoNewPrivs"].strip() == "1"
    wanted = sum(1 << _CAP_BITS[c] for c in KEPT_CAPABILITIES)
    assert int(status["CapBnd"], 16) == wanted
