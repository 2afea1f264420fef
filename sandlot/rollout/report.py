"""``report.html``: one self-contained page over a rollout's ``trajectories.jsonl``.

The page lists every episode (the latest trajectory of each ``instance_id``/``sample``, sorted)
with its reward, exit reason, turns, time split and audit flags (:mod:`sandlot.rollout.audit`);
each row is a ``<details>`` element that expands to the flags with their turn and command, the
prompt, every turn's text, tool calls and observations, the model patch and the test log. A
summary (pass@1, avg@n, pass@k, exit reasons, mean time split, flags per rule) heads it, and a
small inline script filters episodes by text (rule names included) and outcome.

Self-contained: CSS and script are inline, nothing is loaded from anywhere (a
``Content-Security-Policy`` of ``default-src 'none'`` makes sure), so it opens offline and can be
mailed or archived. Everything taken from a trajectory is HTML-escaped: model output is hostile
input. Very long texts are clipped in the page (head and tail kept); ``trajectories.jsonl`` has
them whole.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sandlot.datasets.instance import Instance
from sandlot.rollout.audit import EpisodeAudit, audit_episode
from sandlot.rollout.record import EpisodeRecord
from sandlot.rollout.store import atomic_write, iter_trajectories
from sandlot.rollout.summary import RolloutSummary, summarize
from sandlot.rollout.trajectory import TIMING_KEYS, Step, Trajectory

REPORT_FILE = "report.html"
MAX_TEXT_CHARS = 40_000
"""Longest text shown in one block of the page; longer ones keep their head and tail."""

# The phases of the time-split bar (``agent`` is drawn as its model and tools parts).
_BAR_PHASES = ("start", "setup", "model", "tools", "eval")

_CSS = """
:root { --fg: #1d232a; --muted: #5b6570; --line: #d8dde3; --bg: #ffffff; --alt: #f5f7f9;
  --ok: #1a7f37; --bad: #b42318; --warn: #9a6700; --code: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0 auto; max-width: 1400px; padding: 16px 24px 64px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
.meta { color: var(--muted); margin: 0 0 12px; }
table.kv { border-collapse: collapse; margin-right: 24px; vertical-align: top;
  display: inline-table; }
table.kv td, table.kv th { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0;
  text-align: left; }
table.kv th { color: var(--muted); font-weight: 500; }
.controls { display: flex; gap: 12px; align-items: center; margin: 16px 0 8px;
  position: sticky; top: 0; background: var(--bg); padding: 8px 0; z-index: 1; }
.controls input { flex: 0 1 360px; padding: 4px 8px; }
.row { display: grid; grid-template-columns: minmax(220px, 2.2fr) 60px 70px 130px 60px 80px
  minmax(180px, 2fr) minmax(120px, 1.5fr); gap: 10px; align-items: center; padding: 4px 8px; }
.flag { display: inline-block; font-size: 11px; color: var(--bad); border: 1px solid var(--bad);
  border-radius: 3px; padding: 0 4px; margin: 1px 2px 1px 0; }
.head { font-weight: 600; color: var(--muted); border-bottom: 2px solid var(--line); }
details.episode { border-bottom: 1px solid var(--line); }
details.episode > summary { list-style: none; cursor: pointer; }
details.episode > summary::-webkit-details-marker { display: none; }
details.episode > summary:hover { background: var(--alt); }
details.episode[open] > summary { background: var(--alt); font-weight: 600; }
.iid { overflow-wrap: anywhere; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: var(--ok); } .bad { color: var(--bad); } .warn { color: var(--warn); }
.bar { display: flex; height: 12px; border-radius: 2px; overflow: hidden;
  background: var(--line); }
.bar span { display: block; height: 100%; }
.p-start { background: #8250df; } .p-setup { background: #bf8700; }
.p-model { background: #0969da; } .p-tools { background: #1a7f37; }
.p-eval { background: #cf222e; }
.legend span { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }
.body { padding: 8px 16px 16px; }
pre { background: var(--code); border: 1px solid var(--line); border-radius: 4px;
  padding: 8px; margin: 4px 0; white-space: pre-wrap; overflow-wrap: anywhere;
  max-height: 480px; overflow: auto; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo,
  monospace; }
.msg, .turn { border-left: 3px solid var(--line); padding-left: 10px; margin: 10px 0; }
.role { font-weight: 600; color: var(--muted); text-transform: uppercase; font-size: 11px; }
.call { margin: 6px 0 6px 8px; }
.tool { font-weight: 600; }
.d-add { color: var(--ok); } .d-del { color: var(--bad); } .d-hunk { color: #8250df; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; overflow-wrap: anywhere; }
dl.args { margin: 4px 0; } dl.args dt { padding-top: 8px; } dl.args pre { margin: 2px 0; }
"""

_SCRIPT = """
(function () {
  var episodes = Array.prototype.slice.call(document.querySelectorAll("details.episode"));
  var filter = document.getElementById("filter");
  var outcome = document.getElementById("outcome");
  var shown = document.getElementById("shown");
  function apply() {
    var query = filter.value.trim().toLowerCase();
    var want = outcome.value;
    var count = 0;
    episodes.forEach(function (ep) {
      var match = (!query || ep.getAttribute("data-search").indexOf(query) !== -1) &&
        (want === "all" || ep.getAttribute("data-outcome") === want);
      ep.hidden = !match;
      if (match) { count += 1; }
    });
    shown.textContent = String(count);
  }
  filter.addEventListener("input", apply);
  outcome.addEventListener("change", apply);
  document.getElementById("expand").addEventListener("click", function () {
    episodes.forEach(function (ep) { if (!ep.hidden) { ep.open = true; } });
  });
  document.getElementById("collapse").addEventListener("click", function () {
    episodes.forEach(function (ep) { ep.open = false; });
  });
  apply();
  document.body.setAttribute("data-ready", "1");
})();
"""


def _e(value: object) -> str:
    """``value`` as text, HTML-escaped (quotes included, so it is safe in attributes)."""
    return html.escape(str(value), quote=True)


def _clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return (
        f"{text[:half]}\n[... {len(text) - 2 * half} characters not shown in the report; "
        f"trajectories.jsonl has them ...]\n{text[-half:]}"
    )


def _pre(text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<pre{attr}>{_e(_clip(text))}</pre>"


def _diff(patch: str) -> str:
    lines = []
    for line in _clip(patch).splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            cls = "d-add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "d-del"
        elif line.startswith("@@"):
            cls = "d-hunk"
        else:
            lines.append(_e(line))
            continue
        lines.append(f'<span class="{cls}">{_e(line)}</span>')
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} s" if value < 600 else f"{value / 60:.1f} min"


def _outcome(traj: Trajectory) -> str:
    if traj.exit_reason.value == "infra_error":
        return "error"
    return "resolved" if traj.resolved else "unresolved"


def _verdict(traj: Trajectory) -> tuple[str, str]:
    """(text, css class) of the episode's evaluation."""
    if traj.eval is None:
        return ("error" if traj.exit_reason.value == "infra_error" else "not evaluated"), "bad"
    if traj.resolved:
        return "resolved", "ok"
    return traj.eval.status.value, ("bad" if traj.eval.status.is_error else "warn")


def _bar(timings: Mapping[str, float]) -> str:
    parts = {phase: max(0.0, float(timings.get(phase, 0.0))) for phase in _BAR_PHASES}
    whole = sum(parts.values())
    title = ", ".join(
        f"{k} {_seconds(timings.get(k))}" for k in ("queue", *_BAR_PHASES, "total") if k in timings
    )
    spans = "".join(
        f'<span class="p-{phase}" style="width:{100 * value / whole:.2f}%"></span>'
        for phase, value in parts.items()
        if whole > 0 and value > 0
    )
    return f'<div class="bar" title="{_e(title)}">{spans}</div>'


def _facts(items: Iterable[tuple[str, Any]]) -> str:
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items if v not in (None, ""))
    return f'<dl class="facts">{rows}</dl>'


def _message(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if not isinstance(content, str):
        content = json.dumps(content, indent=2, ensure_ascii=False)
    extra = ""
    if message.get("tool_calls"):
        extra = _pre(json.dumps(message["tool_calls"], indent=2, ensure_ascii=False))
    return (
        f'<div class="msg"><div class="role">{_e(message.get("role", "?"))}</div>'
        f"{_pre(content)}{extra}</div>"
    )


def _arguments(arguments: Mapping[str, Any] | str) -> str:
    """A tool call's arguments, strings shown as they are (not JSON-escaped)."""
    if isinstance(arguments, str):  # not a JSON object: kept as the model wrote it
        return _pre(arguments)
    rows = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        rows.append(f"<dt>{_e(key)}</dt><dd>{_pre(text)}</dd>")
    return f'<dl class="facts args">{"".join(rows)}</dl>' if rows else ""


def _step(step: Step) -> str:
    head = (
        f'<div class="role">turn {step.turn} · model {_seconds(step.model_s)} · tools '
        f"{_seconds(step.tools_s)} · {step.prompt_tokens} prompt + {step.completion_tokens} "
        "completion tokens</div>"
    )
    parts = [head, _pre(step.content) if step.content else ""]
    if step.format_error:
        parts.append('<div class="bad">tool calls not understood:</div>')
        parts.append(_pre(step.format_error))
    for obs in step.observations:
        status = "ok" if obs.status == "ok" else "bad"
        parts.append(
            f'<div class="call"><span class="tool">{_e(obs.tool)}</span> '
            f'<span class="{status}">{_e(obs.status)}</span> · {_seconds(obs.duration_s)}'
            f'{_arguments(obs.arguments)}<div class="role">observation</div>'
            f"{_pre(obs.output)}</div>"
        )
    return f'<div class="turn">{"".join(parts)}</div>'


def _badges(audit: EpisodeAudit) -> str:
    return "".join(f'<span class="flag">{_e(name)}</span>' for name in audit.rules)


def _flags(audit: EpisodeAudit) -> str:
    """The episode's audit flags, each with its turn and command."""
    parts = [f"<h3>Audit flags ({len(audit.flags)})</h3>"] if audit.flags else []
    for flag in audit.flags:
        where = f"turn {flag.turn}" if flag.turn is not None else "grader"
        parts.append(
            f'<div class="call"><span class="flag">{_e(flag.rule)}</span> {_e(where)}'
            f"{_pre(flag.command) if flag.command else ''}{_pre(flag.detail)}</div>"
        )
    if audit.unchecked:
        parts.append(
            f'<p class="warn">not checked (instance unknown): {_e(", ".join(audit.unchecked))}</p>'
        )
    return "".join(parts)


def _episode(index: int, traj: Trajectory, audit: EpisodeAudit) -> str:
    verdict, verdict_cls = _verdict(traj)
    search = " ".join(
        [
            traj.instance_id,
            f"#{traj.sample}",
            traj.exit_reason.value,
            verdict,
            traj.error or "",
            *audit.rules,
        ]
    ).lower()
    reward_cls = "ok" if traj.reward > 0 else "bad"
    summary = (
        f'<summary class="row"><span class="iid">{_e(traj.instance_id)}</span>'
        f'<span class="num">#{traj.sample}</span>'
        f'<span class="num {reward_cls}">{traj.reward:.1f}</span>'
        f'<span class="{verdict_cls}">{_e(traj.exit_reason.value)}</span>'
        f'<span class="num">{traj.num_turns}</span>'
        f'<span class="num">{_e(_seconds(traj.timings_s.get("total")))}</span>'
        f"{_bar(traj.timings_s)}<span>{_badges(audit)}</span></summary>"
    )
    ev = traj.eval
    facts = _facts(
        [
            ("verdict", verdict),
            ("error", traj.error),
            ("model", traj.model_name_or_path),
            ("attempts", traj.attempts),
            ("format errors", traj.format_errors),
            ("tool timeouts", traj.tool_timeouts),
            ("tokens", f"{traj.usage.prompt_tokens} prompt, {traj.usage.completion_tokens} out"),
            (
                "time split",
                ", ".join(
                    f"{k} {_seconds(traj.timings_s[k])}" for k in TIMING_KEYS if k in traj.timings_s
                ),
            ),
            ("patch applied with", ev.patch_apply_command if ev else None),
            ("tests exit code", ev.tests_exit_code if ev else None),
            ("eval error", ev.error if ev else None),
            ("log warnings", "; ".join(ev.log_warnings) if ev else None),
        ]
    )
    body = [facts, _flags(audit)]
    prompt_end = next(
        (i for i, m in enumerate(traj.messages) if m.get("role") == "assistant"),
        len(traj.messages),
    )
    if traj.steps:
        body.append("<h3>Prompt</h3>")
        body.extend(_message(m) for m in traj.messages[:prompt_end])
        body.append(f"<h3>Turns ({len(traj.steps)})</h3>")
        body.extend(_step(s) for s in traj.steps)
    else:
        body.append(f"<h3>Messages ({len(traj.messages)})</h3>")
        body.extend(_message(m) for m in traj.messages)
    body.append("<h3>Model patch</h3>")
    body.append(_diff(traj.model_patch) if traj.model_patch else "<p>(empty)</p>")
    if ev is not None:
        tests = []
        for name, outcome in (("FAIL_TO_PASS", ev.FAIL_TO_PASS), ("PASS_TO_PASS", ev.PASS_TO_PASS)):
            if outcome.failure:
                tests.append((f"{name} failing", ", ".join(outcome.failure)))
            if outcome.success:
                tests.append((f"{name} passing", f"{len(outcome.success)} tests"))
        body.append(f"<h3>Tests ({_e(ev.status.value)})</h3>")
        body.append(_facts(tests))
        body.append(_pre(ev.log) if ev.log else "<p>(no test log)</p>")
    return (
        f'<details class="episode" id="ep-{index}" data-outcome="{_outcome(traj)}" '
        f'data-search="{_e(search)}">{summary}<div class="body">{"".join(body)}</div></details>'
    )


def _summary_tables(summary: RolloutSummary, audits: list[EpisodeAudit]) -> str:
    scores: list[tuple[str, object]] = [
        ("episodes", summary.episodes),
        ("instances", summary.instances),
        ("samples per instance", summary.samples),
        ("pass@1 (first sample)", f"{summary.pass_at_1:.1%}"),
    ]
    if summary.samples > 1:
        scores.append((f"avg@{summary.samples}", f"{summary.avg_at_n:.1%}"))
        scores.extend((k, f"{v:.1%}") for k, v in summary.pass_at_k.items() if k != "pass@1")
    scores.extend(
        [
            ("resolved episodes", summary.resolved_episodes),
            ("mean turns", f"{summary.mean_turns:.1f}"),
            ("format errors", summary.format_errors),
            ("infra errors", summary.infra_errors),
            ("tokens", f"{summary.prompt_tokens} prompt, {summary.completion_tokens} out"),
        ]
    )
    tables: list[tuple[str, list[tuple[str, object]]]] = [
        ("scores", scores),
        ("exit reasons", list(summary.exit_reasons.items())),
    ]
    tables.append(("evaluations", list(summary.eval_statuses.items())))
    total = summary.mean_timings_s.get("total") or 0.0
    split: list[tuple[str, object]] = []
    for phase, value in summary.mean_timings_s.items():
        share = f" ({value / total:.0%})" if total and phase not in ("queue", "total") else ""
        note = " (before the episode)" if phase == "queue" else ""
        label = f"· {phase}" if phase in ("model", "tools") else phase  # parts of agent
        split.append((label, f"{_seconds(value)}{share}{note}"))
    tables.append(("mean time split", split))
    flagged: dict[str, int] = {}
    for audit in audits:
        for name in audit.rules:
            flagged[name] = flagged.get(name, 0) + 1
    tables.append(("audit flags (episodes)", list(flagged.items()) or [("none", 0)]))
    out = []
    for caption, rows in tables:
        cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        out.append(f'<table class="kv"><caption>{_e(caption)}</caption>{cells}</table>')
    return "".join(out)


def render_report(
    trajectories: Iterable[Trajectory],
    *,
    title: str = "sandlot rollout",
    meta: Mapping[str, object] | None = None,
    instances: Mapping[str, Instance] | None = None,
) -> Iterator[str]:
    """The page, in chunks (join them or write them out).

    Args:
        trajectories: the episodes (shown sorted by ``instance_id``, then ``sample``).
        title: the page's heading.
        meta: facts shown under the heading (model, dataset, backend, ...).
        instances: the episodes' instances by id, for the audit rules that read them (an
            episode without one shows those rules as not checked).
    """
    episodes = sorted(trajectories, key=lambda t: (t.instance_id, t.sample))
    summary = summarize(EpisodeRecord.of(t) for t in episodes)
    known = instances or {}
    audits = [audit_episode(t, known.get(t.instance_id)) for t in episodes]
    facts = " · ".join(f"{_e(k)}: {_e(v)}" for k, v in (meta or {}).items() if v not in (None, ""))
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    yield (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{_e(title)}</h1><p class="meta">{facts}'
        f"{' · ' if facts else ''}generated {_e(generated)}</p></header>"
        f'<section id="summary"><h2>Summary</h2>{_summary_tables(summary, audits)}</section>'
        f"<h2>Episodes</h2>"
        '<div class="controls"><input id="filter" type="search" '
        'placeholder="filter: instance id, exit reason, verdict, error">'
        '<select id="outcome"><option value="all">all</option>'
        '<option value="resolved">resolved</option><option value="unresolved">unresolved'
        '</option><option value="error">infra errors</option></select>'
        f'<span><span id="shown">{len(episodes)}</span> of '
        f'<span id="total">{len(episodes)}</span> episodes shown</span>'
        '<button id="expand" type="button">expand shown</button>'
        '<button id="collapse" type="button">collapse all</button>'
        '<span class="legend">'
        + "".join(f'<span class="p-{p}"></span>{p}' for p in _BAR_PHASES)
        + "</span></div>"
        '<div class="row head"><span>instance</span><span class="num">sample</span>'
        '<span class="num">reward</span><span>exit reason</span><span class="num">turns</span>'
        '<span class="num">time</span><span>time split</span><span>flags</span></div>\n'
    )
    for index, (traj, audit) in enumerate(zip(episodes, audits, strict=True)):
        yield _episode(index, traj, audit) + "\n"
    yield f"<script>{_SCRIPT}</script></body></html>\n"


def write_report(
    trajectories: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    title: str = "sandlot rollout",
    meta: Mapping[str, object] | None = None,
    instances: Mapping[str, Instance] | None = None,
) -> int:
    """Build the page from a ``trajectories.jsonl`` and write it atomically to ``dest``
    (``instances`` as :func:`render_report`).

    Returns:
        The number of episodes shown.

    Raises:
        FileNotFoundError: no ``trajectories`` file.
        TrajectoryFileError: a line other than the last is not a trajectory.
    """
    episodes = list(iter_trajectories(trajectories))
    page = render_report(episodes, title=title, meta=meta, instances=instances)
    atomic_write(dest, "".join(page))
    return len(episodes)


def report_meta(directory: str | os.PathLike[str]) -> dict[str, object]:
    """The facts of a rollout directory's ``summary.json`` worth showing under the title."""
    path = Path(directory) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    run = data.get("run", {}) if isinstance(data, dict) else {}
    keys = ("model", "dataset", "backend", "samples", "run_id")
    return {k: run[k] for k in keys if isinstance(run, dict) and k in run}
