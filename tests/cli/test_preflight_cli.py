"""The preflight of `sandlot eval` and `sandlot rollout` through the CLI: each problem known
before the run is one `Error:` line with its fix, exit 2, no traceback; each check also passes.

No test reaches the network: registries, engines, control planes and model servers are
closed ports or small servers on 127.0.0.1, or fakes at the SDK boundary.
"""

from __future__ import annotations

import errno
import http.server
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from requirements import (
    KUBERNETES,
    MODAL,
    docker_engine_missing,
    importable,
    module_missing,
    need,
    needs,
)
from swe_mini_copy import SWE_MINI_ROWS, swe_mini_copy

import sandlot.cli.eval_cmd as eval_cmd
import sandlot.cli.rollout_cmd as rollout_cmd
import sandlot.preflight.images as preflight_images
import sandlot.preflight.output as preflight_output
from sandlot.cli.main import cli
from sandlot.preflight import Problem

SWE_MINI = SWE_MINI_ROWS  # replaced by _swe_mini_copy: a copy whose repositories exist


@pytest.fixture(autouse=True, scope="module")
def _swe_mini_copy(tmp_path_factory: pytest.TempPathFactory) -> None:
    global SWE_MINI
    SWE_MINI = swe_mini_copy(tmp_path_factory.mktemp("swe-mini"))


class Stopped(Exception):
    """Raised by the spy in place of the run: the preflight passed."""


@pytest.fixture
def passed(monkeypatch: pytest.MonkeyPatch) -> list[list[Problem]]:
    """Makes a command stop right after its preflight, keeping what it found (a passing
    preflight finds nothing; the run itself is not what these tests are about)."""
    seen: list[list[Problem]] = []

    def spy(problems: list[Problem]) -> None:
        seen.append(list(problems))
        raise SystemExit(99)

    monkeypatch.setattr(eval_cmd, "exit_on", spy)
    monkeypatch.setattr(rollout_cmd, "exit_on", spy)
    return seen


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _errors(args: list[str]) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(cli, args)
    output = result.output
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    return result.exit_code, lines, output


def one_error(args: list[str], *words: str) -> str:
    """Run ``sandlot ARGS``; assert exit 2 and exactly one ``Error:`` line holding ``words``."""
    code, lines, output = _errors(args)
    assert code == 2, output
    assert len(lines) == 1, output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def eval_args(tmp_path: Path, *extra: str, dataset: Path | None = None) -> list[str]:
    dataset = dataset or SWE_MINI
    out = ["--output-dir", str(tmp_path / "out")]
    args = ["eval", "--dataset", str(dataset), "--predictions", "gold", *extra]
    return args + ([] if "--output-dir" in extra else out)


# ------------------------------------------------------------------ output directory


def test_an_output_dir_that_cannot_be_created_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = one_error(
        eval_args(tmp_path, "--output-dir", str(tmp_path / "file" / "out")),
        "--output-dir",
        "is a file",
        "choose another --output-dir",
    )
    assert line.count("Error:") == 1


def test_a_read_only_output_dir_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only mount refuses root too (mode bits do not): the check writes, and the file
    system's refusal (faked here: mounting needs privileges) is the error."""

    def read_only(**kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(preflight_output.tempfile, "TemporaryFile", read_only)
    one_error(eval_args(tmp_path), "--output-dir", "is not writable (Read-only file system")


def test_a_full_output_file_system_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        preflight_output.shutil, "disk_usage", lambda _: usage._replace(free=5 << 20)
    )
    one_error(eval_args(tmp_path), "--output-dir", "5 MiB free", "free space")


def test_a_writable_output_dir_with_space_passes(
    tmp_path: Path, passed: list[list[Problem]]
) -> None:
    code, _, output = _errors(eval_args(tmp_path))
    assert code == 99, output
    assert passed == [[]]
    assert not (tmp_path / "out").exists()  # the check leaves nothing behind


# ------------------------------------------------------------------ dataset


def test_an_empty_dataset_is_one_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_error(eval_args(tmp_path, dataset=empty), str(empty), "holds no instances")


# ------------------------------------------------------------------ images


def _dataset(tmp_path: Path, images: list[str]) -> Path:
    """The first swe-mini instances, one per entry of ``images``, each in that image."""
    rows = [json.loads(line) for line in SWE_MINI.read_text().splitlines()[: len(images)]]
    path = tmp_path / "instances.jsonl"
    path.write_text(
        "".join(json.dumps({**r, "image": i}) + "\n" for r, i in zip(rows, images, strict=True))
    )
    for row in rows:
        (tmp_path / row["repo_source"]).mkdir(parents=True, exist_ok=True)
    return path


def test_each_distinct_image_is_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passed: list[list[Problem]]
) -> None:
    asked: list[str] = []

    def check_remote(ref: Any, *, creds: str | None = None) -> None:
        asked.append(ref.text)

    monkeypatch.setattr(preflight_images, "check_remote", check_remote)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    images = ["registry.test:5000/a:1", "registry.test:5000/b:1"] * 3
    code, _, output = _errors(eval_args(tmp_path, dataset=_dataset(tmp_path, images)))
    assert code == 99, output
    assert passed == [[]]
    assert sorted(asked) == ["registry.test:5000/a:1", "registry.test:5000/b:1"]


@needs(
    lambda: None if shutil.which("skopeo") else "skopeo is not installed (apt-get install skopeo)"
)
def test_an_image_on_a_refused_registry_is_one_error_for_all_its_instances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    registry = f"127.0.0.1:{closed_port()}"
    line = one_error(
        eval_args(tmp_path, "--image", f"{registry}/x:1"),
        f"image {registry}/x:1 (8 instance(s))",
        f"nothing answers at the registry {registry}",
        "start the registry or correct the image name",
    )
    assert "connection refused" in line


def test_a_missing_root_filesystem_directory_is_one_error(tmp_path: Path) -> None:
    one_error(
        eval_args(tmp_path, "--image", str(tmp_path / "no-rootfs")),
        "no-rootfs",
        "does not exist",
    )


def test_host_on_a_container_backend_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOLCE_ACCESS_KEY", "ak-test")
    monkeypatch.setenv("VOLCE_SECRET_KEY", "sk-test")
    one_error(
        eval_args(tmp_path, "--backend", "vefaas", "--image", "host"),
        "image host",
        "8 instance(s)",
        "only the local backend runs",
        "pass --image REF",
    )


def test_a_container_image_on_a_container_backend_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passed: list[list[Problem]]
) -> None:
    monkeypatch.setenv("VOLCE_ACCESS_KEY", "ak-test")
    monkeypatch.setenv("VOLCE_SECRET_KEY", "sk-test")
    code, _, output = _errors(eval_args(tmp_path, "--backend", "vefaas", "--image", "python:3.12"))
    assert code == 99, output
    assert passed == [[]]


# ------------------------------------------------------------------ backend credentials


def test_missing_vefaas_keys_are_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("VOLCE_ACCESS_KEY", "VOLCE_SECRET_KEY", "VOLCENGINE_ACCESS_KEY",
                "VOLCENGINE_SECRET_KEY"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    one_error(
        eval_args(tmp_path, "--backend", "vefaas", "--image", "python:3.12"),
        "backend vefaas",
        "VOLCE_ACCESS_KEY",
    )


def test_no_kubeconfig_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need(module_missing("kubernetes_asyncio", KUBERNETES) is None, "kubernetes_asyncio missing")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    one_error(
        eval_args(tmp_path, "--backend", "kubernetes", "--image", "python:3.12"),
        "backend kubernetes",
        "no-kubeconfig",
        "KUBECONFIG",
    )


@pytest.fixture
def modal_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Modal token or profile of the user's."""
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "modal.toml"))


def test_missing_modal_credentials_are_one_error(tmp_path: Path, modal_env: None) -> None:
    one_error(
        eval_args(tmp_path, "--backend", "modal", "--image", "python:3.12"),
        "backend modal",
        "no Modal credentials",
        "MODAL_TOKEN_ID",
    )


@needs(importable("modal", MODAL))
def test_an_unreachable_modal_control_plane_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modal_env: None
) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    monkeypatch.setenv("MODAL_SERVER_URL", f"http://127.0.0.1:{closed_port()}")
    one_error(
        eval_args(tmp_path, "--backend", "modal", "--image", "python:3.12"),
        "backend modal",
        "control plane",
        "unreachable",
        "MODAL_SERVER_URL",
    )


@needs(importable("modal", MODAL))
def test_modal_credentials_and_a_reachable_control_plane_pass(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    modal_env: None,
    passed: list[list[Problem]],
) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts; nothing more is asked
        monkeypatch.setenv("MODAL_SERVER_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        code, _, output = _errors(
            eval_args(tmp_path, "--backend", "modal", "--image", "python:3.12")
        )
    assert code == 99, output
    assert passed == [[]]


def test_an_unreachable_docker_engine_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    one_error(
        eval_args(tmp_path, "--backend", "docker", "--image", "python:3.12"),
        "backend docker",
        "cannot reach the container engine",
        "DOCKER_HOST",
    )


@needs(docker_engine_missing)
def test_an_image_the_engine_has_passes_on_docker(
    tmp_path: Path, passed: list[list[Problem]]
) -> None:
    from requirements import TEST_IMAGE

    code, _, output = _errors(eval_args(tmp_path, "--backend", "docker", "--image", TEST_IMAGE))
    assert code == 99, output
    assert passed == [[]]


@needs(docker_engine_missing)
def test_an_image_neither_in_the_engine_nor_pullable_is_one_error_on_docker(
    tmp_path: Path,
) -> None:
    if shutil.which("skopeo") is None and not _engine_has_distribution():
        pytest.skip("the engine cannot look up registries and skopeo is not installed")
    image = f"127.0.0.1:{closed_port()}/x:1"
    one_error(eval_args(tmp_path, "--backend", "docker", "--image", image), f"image {image}")


def _engine_has_distribution() -> bool:
    import docker

    try:
        docker.from_env(timeout=10).api.inspect_distribution("127.0.0.1:1/x:1")
    except docker.errors.NotFound as exc:
        return exc.explanation not in (None, "Not Found")
    except docker.errors.APIError:
        return True
    return True


# ------------------------------------------------------------------ rollout: model endpoint


class _Models(http.server.BaseHTTPRequestHandler):
    """``GET /v1/models`` listing ``solver``; 401 without ``Bearer good``."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Bearer good":
            self._send(401, {"error": {"message": "bad key"}})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "solver"}]})
        else:
            self._send(404, {"error": {"message": "no route"}})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def model_server() -> Iterator[str]:
    """The base URL (``.../v1``) of a server that lists one model, ``solver``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def agent_config(tmp_path: Path) -> Path:
    path = tmp_path / "agent_config.yaml"
    path.write_text("interaction:\n  max_turns: 1\nconcurrency: 1\n")
    return path


def rollout_args(tmp_path: Path, config: Path, url: str, *extra: str) -> list[str]:
    return [
        "rollout", "--dataset", str(SWE_MINI), "--config", str(config), "--base-url", url,
        "--model", "solver", "--output", str(tmp_path / "out"), "--api-key-env", "PF_KEY",
        *extra,
    ]  # fmt: skip


def test_a_refused_base_url_is_one_error(
    tmp_path: Path, agent_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("httpx")
    monkeypatch.setenv("PF_KEY", "good")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    one_error(
        rollout_args(tmp_path, agent_config, url),
        "--base-url",
        f"does not answer at {url}/models",
        "start it",
        "correct --base-url",
    )


def test_a_refused_api_key_is_one_error(
    tmp_path: Path, agent_config: Path, model_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PF_KEY", "wrong")
    line = one_error(
        rollout_args(tmp_path, agent_config, model_server), "refused the API key", "$PF_KEY"
    )
    assert "wrong" not in line  # the key itself is never printed


def test_an_answering_model_server_passes(
    tmp_path: Path,
    agent_config: Path,
    model_server: str,
    monkeypatch: pytest.MonkeyPatch,
    passed: list[list[Problem]],
) -> None:
    monkeypatch.setenv("PF_KEY", "good")
    code, _, output = _errors(rollout_args(tmp_path, agent_config, model_server))
    assert code == 99, output
    assert passed == [[]]


def test_a_rollout_output_that_cannot_be_created_is_one_error(
    tmp_path: Path, agent_config: Path, model_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PF_KEY", "good")
    (tmp_path / "file").write_text("")
    args = rollout_args(tmp_path, agent_config, model_server)
    args[args.index("--output") + 1] = str(tmp_path / "file" / "out")
    one_error(args, "--output", "is a file")


# ------------------------------------------------------------------ all at once; skipping


def test_every_problem_is_reported_before_exiting(
    tmp_path: Path, agent_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("httpx")
    (tmp_path / "file").write_text("")
    args = rollout_args(tmp_path, agent_config, f"http://127.0.0.1:{closed_port()}/v1")
    args[args.index("--output") + 1] = str(tmp_path / "file" / "out")
    args += ["--backend", "vefaas", "--image", "host"]
    monkeypatch.setenv("VOLCE_ACCESS_KEY", "ak-test")
    monkeypatch.setenv("VOLCE_SECRET_KEY", "sk-test")
    code, lines, output = _errors(args)
    assert code == 2, output
    assert [line.split(":")[1].strip() for line in lines] == [
        "--output",
        "image host",
        "--base-url",
    ]


def test_no_preflight_skips_every_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --no-preflight the run starts, although the preflight would refuse its image."""

    def run_evaluations(*_args: Any, **_kwargs: Any) -> None:
        raise Stopped

    monkeypatch.setattr(eval_cmd, "run_evaluations", run_evaluations)
    missing = str(tmp_path / "no-rootfs")
    code, _, output = _errors(eval_args(tmp_path, "--image", missing))
    assert code == 2 and "no-rootfs" in output  # the preflight refuses it ...
    result = CliRunner().invoke(cli, eval_args(tmp_path, "--image", missing, "--no-preflight"))
    assert isinstance(result.exception, Stopped), result.output  # ... and is skipped
    assert "sandlot eval" in result.output  # the run's own banner: it started
