"""``sandlot eval``/``rollout --repo-mirror``: rows as a user brings them (no ``repo_source``)
evaluate from a directory of bare mirrors (``owner__name.git`` as ``git clone --mirror``
names them, or a symlink), identically on ``local`` and ``docker``; rows with no repository
are refused before the run with one ``Error:`` line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from evalcli_support import make_mirrors, write_rows, wrong_predictions
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, importable, needs

from sandlot.cli.main import cli


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``sandlot ARGS``: exit status and output; a failure is one ``Error:`` line, never a
    traceback."""
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    if result.exit_code:
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(errors) == 1, result.output
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(rows.jsonl without repo_source, the mirror directory, mixed.jsonl predictions)."""
    root = tmp_path_factory.mktemp("mirrors")
    mirrors, rows = make_mirrors(root)
    return (
        write_rows(root / "rows.jsonl", rows),
        mirrors,
        wrong_predictions(root / "mixed.jsonl", rows),
    )


def _run_reports(out: Path, run_id: str) -> dict[str, Any]:
    return {
        model: json.loads((out / run_id / f"{model}.{run_id}.json").read_text())
        for model in ("gold", "mixed")
    }


def _eval_both(made: tuple[Path, Path, Path], out: Path, backend: str, *extra: str) -> str:
    rows, mirrors, mixed = made
    code, output = invoke(
        "eval",
        "--dataset",
        str(rows),
        "--predictions",
        f"gold,{mixed}",
        "--repo-mirror",
        str(mirrors),
        "--backend",
        backend,
        "--run-id",
        backend,
        "--output-dir",
        str(out),
        *extra,
        env={"SANDLOT_REPO_MIRROR": ""},
    )
    assert code == 0, output
    return output


@pytest.fixture(scope="module")
def local_reports(
    made: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The run reports of gold and mixed evaluated on ``local`` (the host image)."""
    if reason := bwrap_missing():
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("local-logs")
    _eval_both(made, out, "local")
    return _run_reports(out, "local")


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_rows_without_repo_source_evaluate_from_bare_and_symlinked_mirrors(
    local_reports: dict[str, Any],
) -> None:
    # acme__alpha.git is a bare mirror in the directory, acme__beta a symlink to one elsewhere
    gold, mixed = local_reports["gold"], local_reports["mixed"]
    assert gold["resolved_ids"] == ["acme__alpha-1", "acme__beta-1"]
    assert mixed["resolved_ids"] == ["acme__alpha-1"]
    assert mixed["unresolved_ids"] == ["acme__beta-1"]
    assert gold["error_ids"] == mixed["error_ids"] == []


@needs(importable("swebench", EVAL), docker_engine_missing)
@pytest.mark.e2e
def test_docker_gives_the_same_reports_as_local(
    made: tuple[Path, Path, Path], local_reports: dict[str, Any], tmp_path: Path
) -> None:
    _eval_both(made, tmp_path, "docker", "--image", TEST_IMAGE)
    assert _run_reports(tmp_path, "docker") == local_reports


def test_rows_without_a_repository_are_refused_before_the_run(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    rows, _, _ = made
    code, out = invoke(
        "eval",
        "--dataset",
        str(rows),
        "--predictions",
        "gold",
        "--backend",
        "local",
        "--output-dir",
        str(tmp_path / "logs"),
        env={"SANDLOT_REPO_MIRROR": ""},
    )
    assert code == 2
    assert "2 instance(s) (acme__alpha-1, acme__beta-1)" in out
    assert "--repo-mirror DIR" in out and "repo_source" in out
    assert not (tmp_path / "logs").exists()  # refused before anything ran


def test_a_mirror_directory_without_the_repo_names_what_it_lacks(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    rows, _, _ = made
    code, out = invoke(
        "eval",
        "--dataset",
        str(rows),
        "--predictions",
        "gold",
        "--backend",
        "local",
        "--repo-mirror",
        str(tmp_path),
        "--output-dir",
        str(tmp_path / "logs"),
    )
    assert code == 2
    assert "acme__alpha[.git], acme__beta[.git]" in out and str(tmp_path) in out


def test_a_repo_source_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    _, rows = make_mirrors(tmp_path / "m")
    rows = [{**row, "repo_source": str(tmp_path / "gone")} for row in rows]
    code, out = invoke(
        "eval",
        "--dataset",
        str(write_rows(tmp_path / "rows.jsonl", rows)),
        "--predictions",
        "gold",
        "--backend",
        "local",
        "--output-dir",
        str(tmp_path / "logs"),
        env={"SANDLOT_REPO_MIRROR": ""},
    )
    assert code == 2
    assert "repo_source does not exist" in out and str(tmp_path / "gone") in out


def test_a_repo_mirror_variable_that_is_no_directory_is_refused(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    rows, _, _ = made
    code, out = invoke(
        "eval",
        "--dataset",
        str(rows),
        "--predictions",
        "gold",
        "--output-dir",
        str(tmp_path / "logs"),
        env={"SANDLOT_REPO_MIRROR": str(tmp_path / "nowhere")},
    )
    assert code == 2 and "SANDLOT_REPO_MIRROR" in out and "nowhere" in out


def test_rows_on_a_container_image_are_trusted_to_hold_the_repository(
    made: tuple[Path, Path, Path],
) -> None:
    """Only ``host`` is known not to hold the repository: SWE-bench images hold it."""
    from sandlot.datasets.loaders import load_instances
    from sandlot.datasets.repo_sources import with_repo_sources

    rows, _, _ = made
    instances = [i.model_copy(update={"image": "img:1"}) for i in load_instances(rows)]
    assert with_repo_sources(instances, backend="docker") == instances


def test_a_symlinked_repo_source_is_resolved_to_its_real_path(
    made: tuple[Path, Path, Path],
) -> None:
    """An upload copies a symlink as a link: the sandbox gets the real path."""
    from sandlot.datasets.loaders import load_instances
    from sandlot.datasets.repo_sources import with_repo_sources

    rows, mirrors, _ = made
    beta = load_instances(rows)[1]
    linked = beta.model_copy(update={"repo_source": str(mirrors / "acme__beta")})
    (settled,) = with_repo_sources([linked], backend="local")
    assert settled.repo_source == os.path.realpath(mirrors / "acme__beta")
    assert settled.repo_source != linked.repo_source


def test_rollout_refuses_rows_without_a_repository(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    rows, _, _ = made
    config = tmp_path / "agent_config.yaml"
    config.write_text("interaction:\n  max_turns: 3\n")
    code, out = invoke(
        "rollout",
        "--dataset",
        str(rows),
        "--config",
        str(config),
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--backend",
        "local",
        "--output",
        str(tmp_path / "out"),
        env={"SANDLOT_REPO_MIRROR": ""},
    )
    assert code == 2 and "acme__alpha-1" in out and "--repo-mirror DIR" in out


def test_data_prepare_finds_mirrors_as_git_clone_mirror_names_them(
    made: tuple[Path, Path, Path],
) -> None:
    from sandlot.datasets.local import mirror_source

    _, mirrors, _ = made
    assert mirror_source(mirrors, "acme/alpha") == str(mirrors / "acme__alpha.git")
    assert mirror_source(mirrors, "acme/beta") == str(mirrors / "acme__beta")
    assert mirror_source(mirrors, "acme/gamma") == str(mirrors / "acme__gamma")


def test_a_repo_mirror_that_does_not_exist_is_a_usage_error(
    made: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    rows, _, _ = made
    code, out = invoke(
        "eval",
        *("--dataset", str(rows), "--predictions", "gold"),
        *("--repo-mirror", str(tmp_path / "nowhere")),
    )
    assert code == 2 and "--repo-mirror" in out and "nowhere" in out


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_the_python_api_follows_a_symlinked_repo_source(made: tuple[Path, Path, Path]) -> None:
    """``sandlot train`` and ``evaluate`` do not pass through the CLI: the upload resolves."""
    import anyio

    import sandlot.rewards
    from sandlot.datasets.loaders import load_instances

    rows, mirrors, _ = made
    beta = load_instances(rows)[1]
    linked = beta.model_copy(update={"repo_source": str(mirrors / "acme__beta")})
    result = anyio.run(lambda: sandlot.rewards.evaluate(linked, linked.patch, backend="local"))
    assert result.resolved, result.error


def test_rollout_rows_take_the_mirror_in_their_sandbox_and_reward_fields(
    made: tuple[Path, Path, Path],
) -> None:
    from sandlot.cli.rollout_cmd import _with_sources
    from sandlot.rollout.rows import load_rows

    rows, mirrors, _ = made
    settled = _with_sources(load_rows(rows, backend="local"), "local", mirrors)
    expected = [
        os.path.realpath(mirrors / "acme__alpha.git"),
        os.path.realpath(mirrors / "acme__beta"),
    ]
    assert [r.instance.repo_source for r in settled] == expected
    assert [r.extra_info.tools_kwargs.env.repo_source for r in settled] == expected
