"""``sandlot image prepull --backend kubernetes``: the DaemonSets that pull a dataset's images
on every node, printed or applied to the fake API server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml
from click.testing import CliRunner
from repo_paths import EXAMPLES

from sandlot.cli.main import cli
from sandlot.sandboxes.kubernetes import KubernetesOptions
from sandlot.sandboxes.kubernetes.prepull import prepull_daemonsets

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes

DATASET = str(EXAMPLES / "swe-mini" / "instances.jsonl")


def test_every_image_is_an_init_container_on_the_sandboxes_nodes() -> None:
    images = [f"registry.example/img:{i}" for i in range(250)]
    options = KubernetesOptions(
        node_selector={"pool": "sandboxes"},
        tolerations=[{"key": "sandbox", "operator": "Exists"}],
        image_pull_secrets=["regcred"],
    )
    sets = prepull_daemonsets(images, options, per_daemonset=100)
    assert [s["metadata"]["name"] for s in sets] == [f"sandlot-prepull-{i}" for i in range(3)]
    pulled = [c["image"] for s in sets for c in s["spec"]["template"]["spec"]["initContainers"]]
    assert pulled == images
    pod = sets[0]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "sandboxes"}
    assert pod["tolerations"] == [{"key": "sandbox", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert sets[0]["spec"]["selector"]["matchLabels"].items() <= (
        sets[0]["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_command_prints_yaml_of_the_datasets_images() -> None:
    result = CliRunner().invoke(
        cli, ["image", "prepull", "--dataset", DATASET, "--node-selector", "pool=cpu"]
    )
    assert result.exit_code == 0, result.output
    (daemonset,) = yaml.safe_load_all(result.output)
    spec = daemonset["spec"]["template"]["spec"]
    assert [c["image"] for c in spec["initContainers"]] == ["python:3.12"]
    assert spec["nodeSelector"] == {"pool": "cpu"}


def test_apply_creates_then_replaces(kube: FakeKubernetes) -> None:
    where = ["--kubeconfig", str(kube.kubeconfig()), "--namespace", "sandlot"]
    for _ in range(2):
        result = CliRunner().invoke(
            cli, ["image", "prepull", "--dataset", DATASET, "--apply", *where]
        )
        assert result.exit_code == 0, result.output
        assert "applied sandlot-prepull in namespace sandlot" in result.output
    stored = kube.objects["daemonsets"][("sandlot", "sandlot-prepull")]
    assert stored["spec"]["template"]["spec"]["initContainers"][0]["image"] == "python:3.12"
    assert ("PUT", "/apis/apps/v1/namespaces/sandlot/daemonsets/sandlot-prepull") in kube.calls
