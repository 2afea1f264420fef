"""``sandlot rollout`` from the command line, against the scripted model server.

Bad input is one line of error. On ``local``: the solvable swe-mini instances are resolved and
``sandlot eval`` of the predictions file agrees; SIGINT keeps every finished trajectory and
leaves no sandbox; after SIGINT or ``kill -9`` the same command completes the rest without
redoing any. On ``docker``: ``kill -9`` then ``sandlot gc --run-id`` leaves no container, and
SIGINT leaves none by itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from requirements import (
    EVAL,
    TEST_IMAGE,
    bwrap_missing,
    docker_engine,
    importable,
    missing,
    needs,
)
from rollout.scripted_server import ScriptedServer

from sandlot.cli.main import cli

SWE_MINI = Path(__file__).resolve().parents[2] / "examples" / "swe-mini"
SANDLOT = [sys.executable, "-c", "from sandlot.cli.main import main; main()"]
USER_TEMPLATE = (
    "<task id={instance_id}>\n{problem_statement}\n</task>\n"
    "The repository is in {workdir}. Fix the issue, then call submit."
)


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def dataset(tmp_path: Path, swe_mini_repos: Path) -> Path:
    """The swe-mini instances, ``repo_source`` pointing at this session's repositories."""
    lines = []
    for line in (SWE_MINI / "instances.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["repo_source"] = str(swe_mini_repos / record["repo"].split("/")[-1])
        lines.append(json.dumps(record))
    path = tmp_path / "instances.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(path: Path, **blocks: Any) -> Path:
    """An agent config whose prompt names the instance (the scripted server finds it so)."""
    config: dict[str, Any] = {
        "prompt": {"user": USER_TEMPLATE},
        "interaction": {"max_turns": 12},
        "concurrency": 4,
        **blocks,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "agent_config.yaml")


def rollout_args(dataset: Path, config: Path, url: str, out: Path, *extra: str) -> list[str]:
    return [
        "rollout",
        "--dataset",
        str(dataset),
        "--config",
        str(config),
        "--base-url",
        url,
        "--model",
        "solver",
        "--output",
        str(out),
        *extra,
    ]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``sandlot ARGS`` in its own process group, output to ``log``."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            [*SANDLOT, *args],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"sandlot did not finish in {timeout} s:\n{log.read_text()}") from None


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"sandlot exited ({proc.returncode}) early:\n{log.read_text()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out waiting:\n{log.read_text()}")
        time.sleep(0.05)


def complete_lines(path: Path) -> list[bytes]:
    """The lines of ``path`` that end with a newline (a torn last one is left out)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].splitlines(keepends=True)


def keys(lines: list[bytes]) -> list[tuple[str, int]]:
    return [(d["instance_id"], d["sample"]) for d in map(json.loads, lines)]


def run(args: list[str], env: dict[str, str], tmp_path: Path, timeout: float = 300) -> str:
    log = tmp_path / f"run-{uuid.uuid4().hex[:6]}.log"
    proc = start(args, env, log)
    code = finish(proc, log, timeout)
    output = log.read_text()
    assert code == 0, output
    return output


# --------------------------------------------------------------------------- bad input


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    if result.exit_code:
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(errors) == 1, result.output
    return result.exit_code, result.output


def test_bad_input_is_a_one_line_error(tmp_path: Path, dataset: Path) -> None:
    good_config = write_config(tmp_path / "good.yaml")
    instances = str(dataset)
    base = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--output", str(tmp_path / "o")]

    code, out = _invoke("rollout", "--dataset", "nope.jsonl", "--config", str(good_config), *base)
    assert code == 2 and "nope.jsonl" in out and "does not exist" in out

    bad = write_config(tmp_path / "bad.yaml", interaction={"max_turn": 3})
    code, out = _invoke("rollout", "--dataset", instances, "--config", str(bad), *base)
    assert code == 2 and "interaction.max_turn" in out

    code, out = _invoke(
        "rollout",
        "--dataset",
        instances,
        "--config",
        str(good_config),
        "--backend",
        "nosuch",
        *base,
    )
    assert code == 2 and "nosuch" in out and "local" in out

    code, out = _invoke(
        "rollout",
        "--dataset",
        instances,
        "--config",
        str(good_config),
        "--base-url",
        "ftp://x",
        "--model",
        "m",
    )
    assert code == 2 and "http://" in out

    code, out = _invoke(
        "rollout",
        "--dataset",
        instances,
        "--config",
        str(good_config),
        "--instance-ids",
        "ghost__ghost-1",
        *base,
    )
    assert code == 2 and "ghost__ghost-1" in out
    assert not (tmp_path / "o").exists()  # nothing written before the input was checked


def test_an_output_dir_of_another_model_is_refused(tmp_path: Path, dataset: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "trajectories.jsonl").write_text(
        json.dumps(
            {
                "instance_id": "ledger__ledger-1",
                "exit_reason": "submitted",
                "model_name_or_path": "other",
            }
        )
        + "\n"
    )
    config = write_config(tmp_path / "c.yaml")
    url = "http://127.0.0.1:9/v1"  # never asked: the output is refused first
    code, output = _invoke(*rollout_args(dataset, config, url, out, "--no-preflight"))
    assert code == 2 and "another model" in output and "other" in output


# --------------------------------------------------------------------------- local


@needs(bwrap_missing)
@pytest.mark.e2e
def test_samples_write_one_prediction_per_instance_and_pass_at_n(
    server: ScriptedServer, dataset: Path, config: Path, local_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = rollout_args(dataset, config, server.url, out, "-n", "3", "--concurrency", "6")
    args[args.index("solver")] = "quitter"  # answers without a tool call: quick, no patch
    args += ["--instance-ids", "ledger__ledger-1,textkit__textkit-2"]
    code, output = _invoke(*args)
    assert code == 0, output
    assert "0/2 resolved" in output and "first sample" in output
    assert len(complete_lines(out / "trajectories.jsonl")) == 6
    predictions = [json.loads(line) for line in complete_lines(out / "predictions.jsonl")]
    assert [p["instance_id"] for p in predictions] == ["textkit__textkit-2", "ledger__ledger-1"]
    assert {p["model_patch"] for p in predictions} == {""}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["samples"] == 3 and summary["run"]["samples"] == 3
    assert set(summary["summary"]["pass_at_k"]) == {"pass@1", "pass@2", "pass@3"}
    assert summary["summary"]["exit_reasons"] == {"no_tool_call": 6}
    assert "api_key" not in json.dumps(summary)


@pytest.mark.slow
@needs(bwrap_missing, importable("swebench", EVAL))
def test_rollout_resolves_swe_mini_and_eval_agrees(
    server: ScriptedServer, dataset: Path, config: Path, local_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    output = run(rollout_args(dataset, config, server.url, out), {}, tmp_path)
    assert "8/8 resolved" in output, output
    trajectories = [
        json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(trajectories) == 8
    rollout_verdicts = {t["instance_id"]: t["eval"]["resolved"] for t in trajectories}
    predictions = [
        json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()
    ]
    assert [p["instance_id"] for p in predictions] == [
        json.loads(line)["instance_id"] for line in dataset.read_text().splitlines()
    ]
    assert {p["model_name_or_path"] for p in predictions} == {"solver"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["pass_at_1"] == 1.0 and summary["run"]["model"] == "solver"
    assert (out / "report.html").read_text().count('class="episode"') == 8

    # The predictions give the same verdicts under `sandlot eval`.
    evals = tmp_path / "eval"
    output = run(
        [
            "eval",
            "--dataset",
            str(dataset),
            "--predictions",
            str(out / "predictions.jsonl"),
            "--run-id",
            "agree",
            "--output-dir",
            str(evals),
        ],
        {},
        tmp_path,
    )
    (report,) = (evals / "agree").glob("*.agree.json")
    run_report = json.loads(report.read_text())
    assert set(run_report["resolved_ids"]) == {i for i, ok in rollout_verdicts.items() if ok}
    assert set(run_report["unresolved_ids"]) == {i for i, ok in rollout_verdicts.items() if not ok}


@pytest.mark.slow
@needs(importable("swebench", EVAL))
@pytest.mark.parametrize("backend", ["local", "docker"])
def test_the_samples_of_an_instance_share_one_agent_and_one_grading_set_up(
    backend: str, server: ScriptedServer, dataset: Path, config: Path, tmp_path: Path
) -> None:
    """``-n 4`` over two instances, reward mode ``fresh``: per instance one agent set-up and
    one grading set-up, every other sandbox a fork, every sample graded."""
    if backend == "local":
        if reason := bwrap_missing():
            missing(reason)
        common = ["--backend", "local"]
    else:
        docker_engine()
        common = ["--backend", "docker", "--image", TEST_IMAGE]
    out = tmp_path / "out"
    ids = "minicalc__minicalc-1,textkit__textkit-1"
    args = rollout_args(dataset, config, server.url, out, *common, "--instance-ids", ids, "-n", "4")
    output = run(args, {"SANDLOT_LOCAL_ROOT": str(tmp_path / "sandboxes")}, tmp_path)
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["eval_statuses"] == {"resolved": 8}, output
    setups = summary["setups"]
    assert setups["agent"]["set_up"] <= 2 and setups["grading"]["set_up"] <= 2, setups
    assert setups["agent"]["set_up"] + setups["agent"]["forked"] == 8, setups
    assert setups["grading"]["forked"] == 8, setups  # the first grading runs in a fork too
    assert "agent sandboxes" in output and "grading sandboxes" in output


@pytest.mark.slow
@needs(bwrap_missing, importable("swebench", EVAL))
def test_sigint_keeps_finished_leaves_no_sandbox_and_resume_completes(
    server: ScriptedServer, dataset: Path, config: Path, local_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = rollout_args(dataset, config, server.url, out, "--concurrency", "2")
    log = tmp_path / "first.log"
    proc = start(args, {}, log)
    trajectories = out / "trajectories.jsonl"
    # Interrupt once an episode has finished and others hold sandboxes.
    wait_for(lambda: bool(complete_lines(trajectories)) and any(local_root.iterdir()), proc, log)
    proc.send_signal(signal.SIGINT)
    assert finish(proc, log, timeout=120) == 128 + signal.SIGINT, log.read_text()
    assert list(local_root.iterdir()) == []  # every sandbox closed
    before = trajectories.read_bytes()
    assert before.endswith(b"\n")
    kept = keys(complete_lines(trajectories))
    assert 1 <= len(kept) < 8 and len(set(kept)) == len(kept)
    assert "interrupted" in log.read_text()
    assert (out / "predictions.jsonl").exists() and (out / "report.html").exists()

    output = run(args, {}, tmp_path)
    assert f"resuming: {len(kept)} episode(s)" in output
    after = trajectories.read_bytes()
    assert after.startswith(before)  # nothing rewritten
    done = keys(complete_lines(trajectories))
    assert len(done) == 8 and len(set(done)) == 8  # the rest, none twice


@pytest.mark.slow
@needs(bwrap_missing, importable("swebench", EVAL))
def test_kill9_then_resume_completes_without_redoing_any(
    server: ScriptedServer, dataset: Path, config: Path, tmp_path: Path
) -> None:
    root = tmp_path / "sandboxes"  # kill -9 leaves the local sandboxes' directories behind
    root.mkdir()
    env = {"SANDLOT_LOCAL_ROOT": str(root)}
    out = tmp_path / "out"
    args = rollout_args(dataset, config, server.url, out, "--concurrency", "2")
    log = tmp_path / "first.log"
    proc = start(args, env, log)
    trajectories = out / "trajectories.jsonl"
    wait_for(lambda: len(complete_lines(trajectories)) >= 2, proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = complete_lines(trajectories)
    assert 2 <= len(before) < 8

    output = run(args, env, tmp_path)
    assert f"resuming: {len(before)} episode(s)" in output
    after = complete_lines(trajectories)
    assert after[: len(before)] == before  # every finished one kept as it was
    done = keys(after)
    assert len(done) == 8 and len(set(done)) == 8


# --------------------------------------------------------------------------- docker


def containers(client: Any, run_id: str) -> list[Any]:
    found: list[Any] = client.containers.list(
        all=True, filters={"label": f"sandlot.run_id={run_id}"}
    )
    return found


@pytest.mark.slow
@needs(importable("swebench", EVAL))
def test_docker_kill9_then_gc_and_sigint_leave_no_container(
    server: ScriptedServer, dataset: Path, config: Path, tmp_path: Path
) -> None:
    client = docker_engine()
    ids = "ledger__ledger-1,textkit__textkit-2,minicalc__minicalc-1"
    common = ["--backend", "docker", "--image", TEST_IMAGE, "--instance-ids", ids]
    state = {"SANDLOT_STATE_DIR": str(tmp_path / "state")}

    # kill -9: the containers outlive the process; `sandlot gc --run-id` removes them.
    killed = f"rollout-kill-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "kill.log"
    args = rollout_args(dataset, config, server.url, tmp_path / "out-kill", *common)
    proc = start(args, {**state, "SANDLOT_RUN_ID": killed}, log)
    try:
        wait_for(lambda: bool(containers(client, killed)), proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert containers(client, killed), "kill -9 should leave the running containers behind"
    output = run(["gc", "--backend", "docker", "--run-id", killed], state, tmp_path)
    assert "killed" in output
    assert containers(client, killed) == []

    # SIGINT: the rollout closes its containers itself and keeps what finished.
    interrupted = f"rollout-int-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out-int"
    log = tmp_path / "int.log"
    proc = start(
        rollout_args(dataset, config, server.url, out, *common),
        {**state, "SANDLOT_RUN_ID": interrupted},
        log,
    )
    try:
        wait_for(lambda: bool(containers(client, interrupted)), proc, log)
        proc.send_signal(signal.SIGINT)
        code = finish(proc, log, timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    left = containers(client, interrupted)
    if left:  # do not leak into the engine, whatever the verdict
        subprocess.run(
            [*SANDLOT, "gc", "--backend", "docker", "--run-id", interrupted], check=False
        )
    assert code in (0, 128 + signal.SIGINT), log.read_text()
    assert left == [], log.read_text()
    for line in complete_lines(out / "trajectories.jsonl"):
        assert json.loads(line)["instance_id"] in ids


@needs(bwrap_missing)
@pytest.mark.e2e
def test_the_generation_config_shapes_every_request(
    server: ScriptedServer, dataset: Path, local_root: Path, tmp_path: Path
) -> None:
    """The yaml's ``generation`` block, with the flags over it, reaches every request; each
    ``max_tokens`` is what is left of ``response_length`` after the tokens the replies
    reported (as training computes it), capped; when it is spent the episode ends."""
    config = write_config(
        tmp_path / "agent_config.yaml",
        generation={
            "response_length": RESPONSE_LENGTH,
            "max_tokens": 1000,
            "temperature": 1.0,
            "chat_template_kwargs": {"enable_thinking": False},
            "extra_body": {"top_k": 20},
        },
    )
    out = tmp_path / "out"
    args = rollout_args(dataset, config, server.url, out, "--instance-ids", "ledger__ledger-2")
    args += ["--temperature", "0.25", "--stop", "</answer>", "--max-tokens", "150"]
    code, output = _invoke(*args)
    assert code == 0, output
    (traj,) = [json.loads(line) for line in complete_lines(out / "trajectories.jsonl")]
    steps = traj["steps"]
    bodies = server.bodies
    # The last reply is not kept: its prompt (the observations) had already spent the budget,
    # so training would not have asked for it.
    assert len(bodies) == len(steps) + 1
    first_prompt = steps[0]["prompt_tokens"]
    used = 0
    asked = []
    for i, body in enumerate(bodies):
        asked.append(body["max_tokens"])
        assert body["max_tokens"] == min(150, RESPONSE_LENGTH - used)
        assert body["temperature"] == 0.25 and body["stop"] == ["</answer>"]
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["top_k"] == 20
        if i < len(steps):
            used = steps[i]["prompt_tokens"] + steps[i]["completion_tokens"] - first_prompt
    assert asked[0] == 150 and asked[-1] < 150  # the cap, then what is left of the budget
    assert traj["exit_reason"] == "context_length"
    assert traj["error"] == "generation.response_length reached"


RESPONSE_LENGTH = 150


def test_bad_generation_flags_are_one_line_errors(tmp_path: Path, config: Path) -> None:
    base = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    instances = str(SWE_MINI / "instances.jsonl")
    common = ["rollout", "--dataset", instances, "--config", str(config), *base]
    code, out = _invoke(*common, "--chat-template-kwargs", "{enable_thinking: no}")
    assert code == 2 and "--chat-template-kwargs" in out and "not JSON" in out
    code, out = _invoke(*common, "--extra-body", '{"model": "x"}')
    assert code == 2 and "generation.extra_body: " in out and "model" in out
    code, out = _invoke(*common, "--top-p", "2")
    assert code == 2 and "generation.top_p" in out


@needs(bwrap_missing)
def test_the_client_flags_override_the_yaml(
    dataset: Path, local_root: Path, tmp_path: Path
) -> None:
    """A server that accepts and never answers: with the yaml's 600 s timeout and 300 s budget
    the turn would wait minutes; ``--request-timeout 0.5 --retry-budget 0`` end it after one
    request, as a retryable ``infra_error`` that names the timeout."""
    config = write_config(
        tmp_path / "agent_config.yaml",
        client={"request_timeout_s": 600, "retry_budget_s": 300},
    )
    out = tmp_path / "out"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        args = rollout_args(dataset, config, url, out, "--instance-ids", "ledger__ledger-1")
        args += ["--request-timeout", "0.5", "--retry-budget", "0", "--max-retries", "0"]
        code, output = _invoke(*args, "--no-preflight")  # the preflight would refuse it
    assert code == 1 and "1 episode(s) ended in infra_error" in output, output
    (traj,) = [json.loads(line) for line in complete_lines(out / "trajectories.jsonl")]
    assert traj["exit_reason"] == "infra_error" and traj["retryable"]
    assert (out / "predictions.jsonl").read_text() == ""  # the model submitted nothing
    assert "failed 1 time(s)" in traj["error"]
    assert "no answer within request_timeout_s=0.5s" in traj["error"]
