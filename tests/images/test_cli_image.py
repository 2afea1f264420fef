"""``sandlot image pull / list / prune`` against the test registry."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from registry import Registry, tiny_image, tools_missing
from requirements import needs

from sandlot.cli.image_cmd import parse_size
from sandlot.cli.main import cli
from sandlot.images.store import ImageStore

pytestmark = needs(tools_missing)

IMAGE_LAYERS = "unpack"
"""The CLI's words for the unpack fallback (the mounted form: ``test_mounted.py``)."""


def test_pull_list_prune(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "40")  # narrow: piped output must still keep names whole
    first, second = tiny_image(registry, tmp_path), tiny_image(registry, tmp_path)
    dataset = tmp_path / "instances.jsonl"
    row = {"repo": "o/r", "base_commit": "0" * 40, "patch": "", "test_patch": "",
           "FAIL_TO_PASS": [], "PASS_TO_PASS": []}  # fmt: skip
    dataset.write_text(
        json.dumps({**row, "instance_id": "a", "image": {"local": second}})
        + "\n"
        + json.dumps({**row, "instance_id": "b", "image": "host"})
        + "\n"
    )
    runner = CliRunner()
    result = runner.invoke(cli, ["image", "pull", first, "--dataset", str(dataset)])
    assert result.exit_code == 0, result.output
    assert "2/2 images ready" in result.output
    listed = runner.invoke(cli, ["image", "list"])
    assert first in listed.output and second in listed.output
    assert listed.output.count("unpacked") == 2 and "fetched" not in listed.output
    pruned = runner.invoke(cli, ["image", "prune", "--older-than", "0s"])
    assert "2 images removed (2 unpacked layers, 6 blobs)" in pruned.output, pruned.output
    assert first not in runner.invoke(cli, ["image", "list"]).output


def test_fetch_only_then_pull_unpacks(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "40")  # narrow: piped output must still keep names whole
    ref = tiny_image(registry, tmp_path)
    runner = CliRunner()
    fetched = runner.invoke(cli, ["image", "pull", "--fetch-only", ref])
    assert fetched.exit_code == 0 and "1/1 images fetched" in fetched.output, fetched.output
    listed = runner.invoke(cli, ["image", "list"]).output
    assert ref in listed and "fetched" in listed and "unpacked" not in listed
    assert not any((tmp_path / "cache" / "layers").iterdir())
    unpacked = runner.invoke(cli, ["image", "pull", ref])
    assert "1/1 images ready" in unpacked.output and "1 layers unpacked" in unpacked.output
    assert "unpacked" in runner.invoke(cli, ["image", "list"]).output
    pruned = runner.invoke(cli, ["image", "prune", "--older-than", "0s"])
    assert "1 images removed (1 unpacked layers, 3 blobs)" in pruned.output, pruned.output


def test_a_failed_pull_is_reported_and_fails_the_command(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["image", "pull", f"{registry.host}/no-such-image:1"])
    assert result.exit_code == 1 and "failed" in result.output


def test_sizes() -> None:
    assert parse_size("200G") == 200 << 30 and parse_size("1.5k") == 1536


@pytest.mark.slow
def test_pull_on_every_ray_node(registry: Registry, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    ref = tiny_image(registry, tmp_path)
    cache = tmp_path / "node-cache"
    env = {"PYTHONPATH": os.pathsep.join(sys.path), "SANDLOT_IMAGE_CACHE": str(cache)}
    ray.init(
        num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}
    )
    try:
        result = CliRunner().invoke(cli, ["image", "pull", ref, "--ray"])
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    assert "1 images on 1 nodes" in result.output
    assert ImageStore(cache).entries()[0].references == (ref,)
