"""The issue's "done when": an instance whose environment exists only in its image resolves
with gold and not with an empty patch on ``local`` with an image pulled from the registry, with
the same report as ``docker`` running the same image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from registry import Registry, build_and_push, local_name, tools_missing
from requirements import TEST_IMAGE, docker_engine_missing, needs

from sandlot.cli.main import cli
from sandlot.images.store import ImageStore
from sandlot.sandboxes.local.jail import DEFAULT_PATH

pytestmark = needs(tools_missing, docker_engine_missing)

SWE_IMAGE = f"""FROM {TEST_IMAGE}
COPY imgonly /opt/imgonly/imgonly
RUN python3 -m venv --system-site-packages /opt/imgpy
ENV PYTHONPATH=/opt/imgonly PATH=/opt/imgpy/bin:{DEFAULT_PATH}
COPY testbed /testbed
RUN cd /testbed && git init -q && git add -A \\
    && git -c user.email=t@t -c user.name=t commit -qm base
"""
"""The library (``imgonly``, found through the image's ``PYTHONPATH``) and the interpreter
(``python``, a virtualenv on the image's ``PATH``; Debian has only ``python3``) exist only in
the image, as does the repository at ``/testbed``."""

FILES = {
    "imgonly/__init__.py": "def double(x):\n    return 2 * x\n",
    "testbed/calc.py": "import imgonly\n\ndef quadruple(x):\n    return imgonly.double(x) + x\n",
    "testbed/tests/test_calc.py": "from calc import quadruple\n\ndef test_zero():\n"
    "    assert quadruple(0) == 0\n",
}


def _patch(path: str, hunk: str, lines: list[str]) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{hunk}\n" + "".join(
        line + "\n" for line in lines
    )


GOLD = _patch("calc.py", "@@ -1,4 +1,4 @@", [
    " import imgonly", " ", " def quadruple(x):",
    "-    return imgonly.double(x) + x", "+    return imgonly.double(imgonly.double(x))",
])  # fmt: skip
TEST_PATCH = _patch("tests/test_calc.py", "@@ -1,4 +1,7 @@", [
    " from calc import quadruple", " ", " def test_zero():", "     assert quadruple(0) == 0",
    "+", "+def test_two():", "+    assert quadruple(2) == 8",
])  # fmt: skip
TEST_CMD = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_calc.py"

RUN_ID = "images-done-when"


def _run_report(output: Path) -> dict[str, object]:
    """The run's SWE-bench style report (``<model>.<run id>.json``; the per-instance ones hold
    timings, which differ)."""
    (report,) = (output / RUN_ID).glob(f"*.{RUN_ID}.json")
    data: dict[str, object] = json.loads(report.read_text())
    return data


@pytest.fixture(scope="module")
def dataset(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("swe")
    for name, text in FILES.items():
        (work / "context" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "context" / name).write_text(text)
    ref = build_and_push(work / "context", SWE_IMAGE, "swe:1", registry)
    git = ["git", "-C", "/testbed", "rev-parse", "HEAD"]
    head = subprocess.run(
        ["podman", "run", "--rm", local_name("swe:1"), *git],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    instance = {
        "instance_id": "imgonly__calc-1",
        "repo": "sandlot-examples/imgonly",
        "base_commit": head,
        "patch": GOLD,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_two"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_zero"],
        "image": {"local": ref, "docker": local_name("swe:1")},
        "workdir": "/testbed",
        "env": {"PYTHONDONTWRITEBYTECODE": "1"},
        "test_cmd": TEST_CMD,
        "log_parser": "parse_log_pytest",
        "eval_timeout": 120,
    }
    path = work / "instances.jsonl"
    path.write_text(json.dumps(instance) + "\n")
    empty = {"instance_id": "imgonly__calc-1", "model_name_or_path": "empty", "model_patch": ""}
    (work / "empty.jsonl").write_text(json.dumps(empty) + "\n")
    return path


@pytest.mark.parametrize("predictions", ["gold", "empty"])
def test_local_image_resolves_as_docker_does(
    dataset: Path, predictions: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    preds = "gold" if predictions == "gold" else str(dataset.parent / "empty.jsonl")
    reports = {}
    for backend in ("local", "docker"):
        out = tmp_path / backend
        result = CliRunner().invoke(
            cli,
            ["eval", "--dataset", str(dataset), "--predictions", preds, "--backend", backend,
             "--run-id", RUN_ID, "--output-dir", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        reports[backend] = _run_report(out)
    assert reports["local"] == reports["docker"]
    resolved = reports["local"]["resolved_ids"]
    assert resolved == (["imgonly__calc-1"] if predictions == "gold" else [])


@pytest.mark.slow
def test_swe_mini_in_an_image_gives_the_docker_report(
    registry: Registry, shared_store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/swe-mini with every instance in the test image (pushed to the registry for
    ``local``, the engine's copy for ``docker``): the same run report, all resolved."""
    examples = Path(__file__).resolve().parents[2] / "examples" / "swe-mini"
    subprocess.run(
        [sys.executable, str(examples / "make_repos.py")], check=True, capture_output=True
    )
    ref = build_and_push(tmp_path / "context", f"FROM {TEST_IMAGE}\n", "swe-mini:1", registry)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    reports = {}
    for backend, image in (("local", ref), ("docker", TEST_IMAGE)):
        out = tmp_path / backend
        result = CliRunner().invoke(
            cli,
            ["eval", "--dataset", str(examples / "instances.jsonl"), "--predictions", "gold",
             "--backend", backend, "--image", image, "--run-id", RUN_ID, "--output-dir", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        reports[backend] = _run_report(out)
    assert reports["local"] == reports["docker"]
    assert reports["local"]["resolved_instances"] == 8
