"""``report.html``: self-contained, every episode shown, hostile model output kept inert;
``sandlot report DIR`` rebuilds it. The page is opened in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner
from requirements import missing

from sandlot.cli.main import cli
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.result import TestOutcome as Outcome
from sandlot.rollout.report import MAX_TEXT_CHARS, render_report, write_report
from sandlot.rollout.trajectory import ExitReason, Step, ToolObservation, Trajectory

HOSTILE = [
    "</pre></details><script>document.body.setAttribute('data-pwned', 'script')</script>",
    "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'img')\">",
    '" onmouseover="alert(1)" x="',
    "<!-- ]]> <style>body{display:none}</style>",
    '<a href="javascript:alert(1)">click</a> <iframe src="https://example.invalid"></iframe>',
]


def hostile_trajectory(i: int, sample: int = 0) -> Trajectory:
    text = HOSTILE[i % len(HOSTILE)]
    resolved = i % 2 == 0
    return Trajectory(
        instance_id=f"proj__proj-{i}",
        sample=sample,
        model_name_or_path=text,
        messages=[
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"Fix it {text}"},
            {"role": "assistant", "content": text},
        ],
        steps=[
            Step(
                turn=1,
                content=f"I will run {text}",
                observations=[
                    ToolObservation(
                        tool="bash",
                        arguments={"command": f"echo '{text}'"},
                        output=text * 3,
                        status="ok",
                        duration_s=0.5,
                    ),
                    ToolObservation(tool="bash", arguments=text, output="bad args", status="error"),
                ],
                format_error=text if i % 3 == 0 else None,
            )
        ],
        exit_reason=ExitReason.INFRA_ERROR if i == 3 else ExitReason.SUBMITTED,
        error=text if i == 3 else None,
        model_patch=f"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-{text}\n+fixed\n",
        reward=1.0 if resolved else 0.0,
        eval=EvalResult(
            instance_id=f"proj__proj-{i}",
            status=EvalStatus.RESOLVED if resolved else EvalStatus.UNRESOLVED,
            resolved=resolved,
            reward=1.0 if resolved else 0.0,
            FAIL_TO_PASS=Outcome(success=[] if not resolved else ["t"], failure=[text]),
            log=f"PASSED {text}\n",
        ),
        num_turns=1,
        timings_s={
            "queue": 0.1,
            "start": 1.0,
            "setup": 2.0,
            "agent": 3.0,
            "model": 1.0,
            "tools": 2.0,
            "eval": 4.0,
            "total": 10.0,
        },
    )


def write_trajectories(path: Path, trajectories: list[Trajectory]) -> None:
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))


def test_everything_from_a_trajectory_is_escaped() -> None:
    page = "".join(render_report([hostile_trajectory(i) for i in range(5)], title=HOSTILE[0]))
    for text in HOSTILE:
        assert text not in page
    # Only our own markup: one script (ours), no img/iframe/style elements from the data.
    assert page.count("<script>") == 1
    assert "<img" not in page and "<iframe" not in page and page.count("<style>") == 1
    assert "javascript:" not in page.replace("javascript:alert", "")
    assert page.count('class="episode"') == 5
    # Self-contained: nothing to fetch.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "default-src 'none'" in page


def test_long_texts_are_clipped_in_the_page_only(tmp_path: Path) -> None:
    big = Trajectory(
        instance_id="a__a-1",
        exit_reason=ExitReason.SUBMITTED,
        model_patch="+" + "x" * (3 * MAX_TEXT_CHARS),
    )
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [big])
    write_report(path, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert "characters not shown in the report" in page
    assert len(page) < 2 * MAX_TEXT_CHARS + 50_000


def test_report_command_rebuilds_the_page(tmp_path: Path) -> None:
    write_trajectories(tmp_path / "trajectories.jsonl", [hostile_trajectory(i) for i in range(4)])
    (tmp_path / "summary.json").write_text(
        json.dumps({"run": {"model": "m-1", "dataset": "d.jsonl", "backend": "local"}})
    )
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "4 episode(s)" in result.output
    page = (tmp_path / "report.html").read_text()
    assert "sandlot rollout: m-1" in page and "d.jsonl" in page
    assert page.count('class="episode"') == 4

    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["report", str(empty)])
    assert result.exit_code == 1 and "no trajectories.jsonl" in result.output
    assert "Traceback" not in result.output


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    missing("headless Chromium is not installed (apt-get install -y chromium)")
    raise AssertionError("unreachable")


def dump_dom(page: Path) -> str:
    """The page's DOM after its scripts ran, as headless Chromium sees it (no network)."""
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_chromium_shows_every_episode_and_runs_no_model_code(tmp_path: Path) -> None:
    episodes = [hostile_trajectory(i, sample=s) for i in range(6) for s in range(2)]
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, episodes)
    assert write_report(path, tmp_path / "report.html") == 12
    dom = dump_dom(tmp_path / "report.html")
    assert 'data-ready="1"' in dom  # our script ran to its end
    body = re.search(r"<body[^>]*>", dom)
    assert body and "data-pwned" not in body.group(0)  # none of the model's did
    assert dom.count('class="episode"') == 12
    assert re.search(r'<span id="shown">12</span>', dom)
    for t in episodes:
        assert f"{t.instance_id}</span>" in dom
    assert "<iframe" not in dom and "<img" not in dom


def test_each_episode_shows_its_audit_flags_with_turn_and_command() -> None:
    def episode(instance_id: str, command: str) -> Trajectory:
        call = ToolObservation(tool="bash", arguments={"command": command}, output="", status="ok")
        return Trajectory(
            instance_id=instance_id,
            exit_reason=ExitReason.SUBMITTED,
            steps=[Step(turn=1, content=""), Step(turn=2, content="", observations=[call])],
        )

    cheat = "git reflog <b>&& curl https://x.invalid</b>"
    page = "".join(render_report([episode("a__a-1", cheat), episode("b__b-1", "git diff")]))
    cheated, honest = page.split('class="episode"')[1:]
    assert cheated.count('<span class="flag">git-history</span>') == 2  # the row and the flag
    assert cheated.count('<span class="flag">network</span>') == 2
    assert "turn 2" in cheated and "git reflog &lt;b&gt;&amp;&amp; curl" in cheated
    assert 'data-search="a__a-1 #0 submitted not evaluated  git-history network"' in cheated
    assert 'class="flag"' not in honest and "Audit flags" not in honest
    # Without the instances the rules that read them are said to be unchecked.
    assert "not checked (instance unknown): unknown-commit, graded-read" in honest
