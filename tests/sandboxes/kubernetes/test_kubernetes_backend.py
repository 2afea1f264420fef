"""The ``kubernetes`` backend against the fake API server: the pod it sends, how a start that
cannot succeed is classified, the faults of a cluster it rides out, and gc by label.

The real client (``kubernetes_asyncio``) is on the wire; pods are bubblewrap jails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from requirements import bwrap_missing, needs

import sandlot
from sandlot import SandboxDeadError, SandboxSpec, SandboxStartError
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.kubernetes import KubernetesOptions, KubernetesSandbox
from sandlot.sandboxes.kubernetes.manifest import DENY_ALL_POLICY, NETWORK_LABEL
from sandlot.sandboxes.labels import OWNER, RUN_ID, SANDBOX_ID, owner
from sandlot.sandboxes.reaper import SandboxReaper, reap
from sandlot.sandboxes.scale.starting import StartLimits

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes

pytestmark = [pytest.mark.anyio, needs(bwrap_missing)]
ONCE = StartLimits(max_attempts=1)


def make(
    kube: FakeKubernetes, spec: SandboxSpec | None = None, **options: Any
) -> KubernetesSandbox:
    spec = spec or SandboxSpec(image="python:3.12", start_limits=ONCE)
    return KubernetesSandbox(spec, KubernetesOptions(**{**kube.options(), **options}))


async def test_the_pod_carries_limits_deadline_labels_and_no_privilege(
    kube: FakeKubernetes,
) -> None:
    spec = SandboxSpec(
        image="python:3.12",
        cpu=1.5,
        memory_mb=2048,
        timeout_s=600.2,
        env={"A": "1"},
        labels={"team": "rl", "note": "not a label value!"},
    )
    opts = {
        "runtime_class_name": "gvisor",
        "node_selector": {"pool": "sandboxes"},
        "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        "image_pull_secrets": ["regcred"],
        "ephemeral_storage_mb": 10240,
    }
    async with make(kube, spec, **opts) as sb:
        assert sb.pod_name is not None
        pod = kube.pod(sb.pod_name)
        assert (await sb.exec("echo $A")).stdout == "1\n"
    meta, pod_spec = pod["metadata"], pod["spec"]
    (container,) = pod_spec["containers"]
    limits = {"cpu": "1500m", "memory": "2048Mi", "ephemeral-storage": "10240Mi"}
    assert container["resources"] == {
        "requests": {"cpu": "1500m", "memory": "2048Mi"},
        "limits": limits,
    }
    assert pod_spec["activeDeadlineSeconds"] == 601
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["restartPolicy"] == "Never"
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "NET_RAW" not in security["capabilities"]["add"]
    assert pod_spec["runtimeClassName"] == "gvisor"
    assert pod_spec["nodeSelector"] == {"pool": "sandboxes"}
    assert pod_spec["tolerations"] == opts["tolerations"]
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    labels, annotations = meta["labels"], meta["annotations"]
    assert labels[RUN_ID] == "run-kubernetes-test" and labels[SANDBOX_ID] == sb.id
    assert labels["team"] == "rl" and "note" not in labels
    assert annotations[OWNER] == owner() and annotations["note"] == "not a label value!"
    assert labels[NETWORK_LABEL] == "none"


async def test_network_false_is_the_deny_all_policy_and_true_is_not_selected(
    kube: FakeKubernetes,
) -> None:
    async with make(kube) as sb:
        r = await sb.exec("cat /proc/net/dev")
        assert r.stdout.count(":") == 1  # loopback only
    policy = kube.objects["networkpolicies"][("sandlot", DENY_ALL_POLICY)]
    assert policy["spec"]["podSelector"] == {"matchLabels": {NETWORK_LABEL: "none"}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not policy["spec"].get("egress") and not policy["spec"].get("ingress")
    async with make(kube, SandboxSpec(image="python:3.12", network=True)) as sb:
        assert sb.pod_name is not None
        assert NETWORK_LABEL not in kube.pod(sb.pod_name)["metadata"]["labels"]


async def test_an_image_that_cannot_be_pulled_is_not_retried_and_names_it(
    kube: FakeKubernetes,
) -> None:
    kube.known_images = {"python:3.12"}
    spec = SandboxSpec(image="no-such/image:1", start_limits=StartLimits(max_attempts=3))
    sb = make(kube, spec)
    with pytest.raises(SandboxStartError, match=r"no-such/image:1.*(ErrImagePull|BackOff)") as e:
        await sb.start()
    assert not e.value.retryable and sb.closed
    assert sum(1 for m, p in kube.calls if m == "POST" and p.endswith("/pods")) >= 1
    await anyio.sleep(0.2)
    assert not any(name.startswith(sb.id) for name in kube.live())


async def test_an_unschedulable_pod_is_retryable_with_the_schedulers_message(
    kube: FakeKubernetes,
) -> None:
    kube.unschedulable = "0/3 nodes are available: 3 Insufficient cpu."
    sb = make(kube, unschedulable_timeout_s=0.3)
    with pytest.raises(SandboxStartError, match="Insufficient cpu") as e:
        await sb.start()
    assert e.value.retryable


async def test_a_pod_scheduled_once_the_cluster_has_room_starts(kube: FakeKubernetes) -> None:
    kube.unschedulable = "0/3 nodes are available: 3 Insufficient memory."
    sb = make(kube, unschedulable_timeout_s=30)

    async def scale_up() -> None:
        await anyio.sleep(0.5)
        kube.unschedulable = None

    async with anyio.create_task_group() as tg:
        tg.start_soon(scale_up)
        async with sb:
            assert (await sb.exec("echo up")).stdout == "up\n"


async def test_an_evicted_pod_is_dead_and_says_why(kube: FakeKubernetes) -> None:
    async with make(kube) as sb:
        assert sb.pod_name is not None
        await anyio.to_thread.run_sync(kube.evict, sb.pod_name, "low on ephemeral-storage")
        with pytest.raises(SandboxDeadError, match="evicted: low on ephemeral-storage"):
            await sb.exec("true")


async def test_a_lost_node_is_dead(kube: FakeKubernetes) -> None:
    async with make(kube) as sb:
        assert sb.pod_name is not None
        await anyio.to_thread.run_sync(kube.lose_node, sb.pod_name)
        with pytest.raises(SandboxDeadError, match="node was lost"):
            await sb.read_file("/etc/hostname")


async def test_a_create_whose_answer_was_lost_is_found_and_not_leaked(
    kube: FakeKubernetes,
) -> None:
    kube.lost_creates = 1
    async with make(kube) as sb:
        assert sb.pod_name == f"{sb.id}-1"  # the first attempt's pod, answered by its 409
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    await anyio.sleep(0.2)
    assert not any(name.startswith(sb.id) for name in kube.live())


async def test_a_dropped_watch_is_followed_by_a_read_and_a_new_watch(
    kube: FakeKubernetes,
) -> None:
    kube.schedule_latency_s = 0.3
    kube.dropped_watches = 2
    async with make(kube) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert ("watch", "dropped") in kube.faults_served


async def test_a_server_speaking_only_v4_still_gives_exit_codes(kube: FakeKubernetes) -> None:
    kube.v4_only = True
    async with make(kube) as sb:
        r = await sb.exec("echo out; echo err >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
        await sb.write_file("a/b.txt", b"x" * 100_000)
        assert await sb.read_file("a/b.txt") == b"x" * 100_000


async def test_disk_mb_is_refused_and_internet_too(kube: FakeKubernetes) -> None:
    with pytest.raises(SandboxStartError, match="disk_mb"):
        await make(kube, SandboxSpec(image="python:3.12", disk_mb=100)).start()
    with pytest.raises(SandboxStartError, match="internet"):
        await make(kube, SandboxSpec(image="python:3.12", network="internet")).start()


async def test_gc_lists_by_run_label_and_deletes(kube: FakeKubernetes) -> None:
    sb = make(kube)
    await sb.start()
    try:
        reaper = SandboxReaper(KubernetesSandbox, **kube.options())
        listed = await reaper.list_sandboxes("run-kubernetes-test")
        mine = [r for r in listed if r.labels.get(SANDBOX_ID) == sb.id]
        assert len(mine) == 1 and mine[0].owner == owner() and mine[0].id == sb.pod_name
        assert await reaper.list_sandboxes("another-run") == []
        report = await reap(reaper, run_id="run-kubernetes-test")
        assert mine[0] in report.killed and not report.failed
        with pytest.raises(SandboxDeadError):
            await sb.exec("true")
    finally:
        await sb.close()


async def test_open_routes_the_options() -> None:
    sb = sandlot.open("kubernetes", image="python:3.12", namespace="ns", runtime_class_name="kata")
    assert isinstance(sb.options, KubernetesOptions)
    assert (sb.options.namespace, sb.options.runtime_class_name) == ("ns", "kata")
    assert not sb.supports_snapshot


async def test_an_environment_install_gets_the_network_then_the_pod_is_labelled_offline(
    kube: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the install sees of the network, instead of a real virtualenv build.
    script = "cat /proc/net/dev > /tmp/network-at-install"
    monkeypatch.setattr(EnvironmentRecipe, "container_script", lambda self: script)
    recipe = EnvironmentRecipe(pip_packages=["iniconfig"])
    async with make(kube, SandboxSpec(image="python:3.12", environment=recipe)) as sb:
        assert sb.pod_name is not None
        at_install = (await sb.read_file("/tmp/network-at-install")).decode()
        assert at_install.count(":") > 1, "the install had no network"
        assert (await sb.exec("cat /proc/net/dev")).stdout.count(":") == 1  # loopback only
        assert kube.pod(sb.pod_name)["metadata"]["labels"][NETWORK_LABEL] == "none"
