"""The runner's side of the pytest channel: install the plugin, start the tests, judge the records.

:mod:`sandlot.rewards.integrity.pytest_channel` (see its docstring for the record format and the
threat model) is written into the sandbox under a fresh random module name for every run, so a
file of the repository cannot shadow it. The shell running the test command moves its standard
input, a pipe holding the per-run key (hex, one line), to fd 3 without reading it and gives the
tests ``/dev/null``; every pytest invocation of the command (``pytest``, ``py.test``, ``python -m
pytest``, at a command position) is rewritten to a shell function that starts the plugin file
itself as a bootstrap (``python -S``, ``PYTHONPATH`` unset) with the key on a pipe (fd 3). The
bootstrap turns the key into an HMAC object and closes the pipe before anything outside the
standard library is importable, loads pytest and the plugin with no directory of the
repository on ``sys.path``, and only then puts the repository's paths back and calls
``pytest.main(plugins=[plugin])``. The records file is read back after the command and checked
with the key, which never entered the sandbox in any other way.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from sandlot.rewards.scripts import EVAL_DIR

PLUGIN_SOURCE = Path(__file__).with_name("pytest_channel.py")
# A pytest invocation as a word of the command: ``pytest``, ``py.test``, ``python -m pytest``.
_PYTEST_WORD = re.compile(r"(?:^|[\s;&|(`/])(?:py\.test|pytest)(?=$|[\s;&|)`])")
# A pytest invocation the channel can wrap: at a command position (start of a line, after
# ``;``, ``&``, ``|``, ``(``, ``{``, ``then``/``do``/``else``/``time``, past ``NAME=value``
# assignments), ``[dir/]pytest``, ``[dir/]py.test`` or ``[dir/]python[X.Y] -m pytest``.
_WORD_CHARS = r"[^\s;&|()<>'\"`$]"
_INVOCATION = re.compile(
    r"(?P<pre>(?:^|[;&|({]|\b(?:then|do|else|time)\b)\s*(?:[A-Za-z_]\w*=\S*\s+)*)"
    rf"(?:(?P<python>(?:{_WORD_CHARS}*/)?python[0-9.]*)\s+-m\s+pytest"
    rf"|(?P<script>(?:{_WORD_CHARS}*/)?(?:py\.test|pytest)))"
    r"(?=$|[\s;&|)])",
    re.M,
)
# The shell function each wrapped invocation calls: ``__sandlot_pytest module|script WORD
# ARGS``. It finds the Python that would run pytest (the interpreter word, or the pytest
# script's ``#!`` line), and starts the plugin file as the bootstrap with the key on fd 3.
_RUN_FUNCTION = "__sandlot_pytest"
_RUN_FUNCTION_SOURCE = r"""__sandlot_pytest() {
  { __sl_x=; case $- in *x*) __sl_x=1; set +x;; esac; } 2>/dev/null
  local __sl_how=$1 __sl_what=$2 __sl_py= __sl_line= __sl_a= __sl_b= __sl_rc=0
  shift 2
  __sl_py=$(command -v "$__sl_what") || __sl_py=
  if [ "$__sl_how" = script ] && [ -n "$__sl_py" ]; then
    __sl_what=$__sl_py
    __sl_py=
    IFS= read -r __sl_line < "$__sl_what" || true
    case $__sl_line in "#!"*)
      __sl_line=${__sl_line#??}
      __sl_line=${__sl_line# }
      __sl_a=${__sl_line%% *}
      __sl_b=${__sl_line#"$__sl_a"}
      __sl_b=${__sl_b# }
      __sl_b=${__sl_b%% *}
      case ${__sl_a##*/} in
        env) __sl_py=$(command -v "$__sl_b") || __sl_py= ;;
        *) __sl_py=$__sl_a ;;
      esac ;;
    esac
    case ${__sl_py##*/} in python*|pypy*) ;; *)
      # pip's script for a long interpreter path: line 2 is '''exec' "/path/python" "$0" "$@"
      { IFS= read -r __sl_line; IFS= read -r __sl_line; } < "$__sl_what" || true
      __sl_line=${__sl_line#"'''exec' \""}
      __sl_py=${__sl_line%%\"*}
      case ${__sl_py##*/} in python*|pypy*) ;; *) __sl_py= ;; esac ;;
    esac
  fi
  if [ -z "$__sl_py" ]; then
    echo "sandlot: no Python found for $__sl_what; the pytest channel is not loaded"
    cat <&3 >/dev/null  # the key is dropped unread, never left to this pytest
    if [ "$__sl_how" = script ]; then command "$__sl_what" "$@" 3<&-
    else command "$__sl_what" -m pytest "$@" 3<&-; fi
  else
    ( export __SANDLOT_PYTHONPATH="${PYTHONPATH-}" __SANDLOT_PYTHONPATH_SET="${PYTHONPATH+1}"
      unset PYTHONPATH
      exec "$__sl_py" -S @PLUGIN@ @MODULE@ @RECORDS@ "$__sandlot_root" "$__sl_how" "$__sl_what" "$@"
    )
  fi
  __sl_rc=$?
  if [ -n "$__sl_x" ]; then set -x; fi
  return $__sl_rc
}
"""
# pytest-xdist's options that start workers: -n 4, -nauto, --numprocesses=2, --dist load.
_XDIST_OPTION = re.compile(r"\s(?:-n\s*\S|--numprocesses\b|--dist\b)")
# pytest's -rA statuses, worst first (a test with a failing teardown is an ERROR).
_PLUGIN_EOF = "SANDLOT_CHANNEL_PLUGIN_EOF"
_SEVERITY = ("ERROR", "FAILED", "SKIPPED", "XPASS", "XFAIL", "PASSED")


def runs_pytest(test_cmd: str) -> bool:
    """``True`` when ``test_cmd`` invokes pytest itself (so the channel plugin can be loaded).

    Django's ``runtests.py``, sympy's ``bin/test``, ``tox`` and R2E-Gym's ``run_tests.sh`` do
    not: they keep the log and exit-status grading.
    """
    return any(_PYTEST_WORD.search(line) for line in test_cmd.splitlines())


def channel_unavailable(test_cmd: str) -> str | None:
    """Why the channel cannot grade ``test_cmd``, or ``None`` when it can.

    Besides commands without pytest, a pytest run with pytest-xdist workers (``-n``,
    ``--numprocesses``, ``--dist``) reports from processes the plugin does not follow; an
    honest run would look forged, so it is graded from the log and the exit status.
    """
    if not runs_pytest(test_cmd):
        return "the test command does not run pytest; graded from the log and the exit status"
    wrapped = {m.end() for m in _INVOCATION.finditer(test_cmd)}
    if any(w.end() not in wrapped for w in _PYTEST_WORD.finditer(test_cmd)):
        return (
            "the test command starts pytest in a way the channel cannot wrap (only `pytest`, "
            "`py.test` and `python -m pytest` at a command position are); graded from the log "
            "and the exit status"
        )
    for line in test_cmd.splitlines():
        found = _PYTEST_WORD.search(line)
        if found and _XDIST_OPTION.search(line, found.end()):
            return (
                "the test command runs pytest-xdist workers (-n/--dist), which the channel "
                "does not follow; graded from the log and the exit status"
            )
    return None


@dataclass(frozen=True)
class ChannelRun:
    """One run's plugin module name, directory in the sandbox and key (32 random bytes)."""

    module: str
    directory: str
    key: bytes

    @property
    def records_path(self) -> str:
        return f"{self.directory}/records"

    @property
    def stdin(self) -> bytes:
        """What the test command's standard input carries: the key, for the plugin only."""
        return self.key.hex().encode() + b"\n"

    def command(self, test_cmd: str, graded: Iterable[str] = ()) -> str:
        """``test_cmd`` behind the preamble that writes the plugin (a here-document: its
        source is no secret), takes the key and defines the function every pytest invocation
        of ``test_cmd`` is rewritten to call (see :func:`wrap_pytest`).

        The key pipe (the command's standard input) moves to fd 3, unread by the shell: the
        first bootstrap drains it, later pytest invocations find it empty. Standard input of
        the tests is ``/dev/null``.

        ``graded``: the graded tests' node ids (FAIL_TO_PASS and PASS_TO_PASS); the bootstrap
        compiles their ``def``s from their files before any code of the repository runs, and
        each of those tests must run that code.
        """
        d, m = shlex.quote(self.directory), shlex.quote(self.module)
        plugin = f"{d}/{m}.py"
        function = (
            _RUN_FUNCTION_SOURCE.replace("@PLUGIN@", plugin)
            .replace("@MODULE@", m)
            .replace("@RECORDS@", shlex.quote(self.records_path))
        )
        return (
            "exec 2>&1\n"
            f"mkdir -p {d} && cat > {plugin} <<'{_PLUGIN_EOF}'\n"
            f"{PLUGIN_SOURCE.read_text()}{_PLUGIN_EOF}\n"
            f"cat > {d}/graded <<'{_PLUGIN_EOF}'\n"
            + "".join(f"{p}\n" for p in graded if "\n" not in p)
            + f"{_PLUGIN_EOF}\n"
            "exec 3<&0 0</dev/null\n"
            "__sandlot_root=$PWD\n"
            f"{function}"
            f"{wrap_pytest(test_cmd)}"
        )


def wrap_pytest(test_cmd: str) -> str:
    """``test_cmd`` with each pytest invocation at a command position calling the channel's
    shell function: ``pytest ARGS`` → ``__sandlot_pytest script pytest ARGS``, ``python3 -m
    pytest ARGS`` → ``__sandlot_pytest module python3 ARGS``."""

    def call(m: re.Match[str]) -> str:
        if m["python"]:
            return f"{m['pre']}{_RUN_FUNCTION} module {m['python']}"
        return f"{m['pre']}{_RUN_FUNCTION} script {m['script']}"

    return _INVOCATION.sub(call, test_cmd)


def new_channel() -> ChannelRun:
    """A fresh module name, directory and key for one run."""
    token = secrets.token_hex(8)
    return ChannelRun(
        module=f"sandlot_channel_{token}",
        directory=f"{EVAL_DIR}/channel-{token}",
        key=secrets.token_bytes(32),
    )


@dataclass
class ChannelVerdict:
    """What the records say.

    Attributes:
        statuses: pytest node id → status (``PASSED``, ``FAILED``, ``ERROR``, ``SKIPPED``,
            ``XFAIL``, ``XPASS``) composed from the test's phases as ``-rA`` reports it.
        violations: reasons not to trust the run (each names the test or record).
        plugin_files: absolute paths of the files that define the run's pytest plugins.
        code_files: node id → absolute path of the file defining the test function's code.
        wrapper_files: node id → files of the repository defining the decorators (with
            ``__wrapped__``) that run around a graded test's code.
        exitstatus: pytest's exit status from the ``end`` record (``None`` without one).
        runner: the ``start`` record's absolute paths of the runner's packages (``pytest``,
            ``_pytest``, ``pluggy`` directories, or module files) that the bootstrap imported
            from the repository, because no pytest outside it could be imported: pytest's
            own work tree is the runner. Empty otherwise.
    """

    statuses: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    plugin_files: list[str] = field(default_factory=list)
    code_files: dict[str, str] = field(default_factory=dict)
    wrapper_files: dict[str, list[str]] = field(default_factory=dict)
    exitstatus: int | None = None
    runner: list[str] = field(default_factory=list)


def _signed_records(text: str, key: bytes, violations: list[str]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    forged = 0
    for line in text.splitlines():
        body, _, mac = line.rpartition("\t")
        good = hmac.new(key, body.encode(), sha256).hexdigest()
        if not body or not hmac.compare_digest(mac, good):
            forged += 1
            continue
        record = json.loads(body)
        if record.get("n") != len(records):
            violations.append(f"channel record {len(records)} is missing or out of order")
            break
        records.append(record)
    if forged:
        violations.append(f"the channel holds {forged} line(s) the plugin did not write")
    return records


def judge_records(text: str, key: bytes) -> ChannelVerdict:
    """Check the records of one run (``text``, the records file) against ``key``.

    Violations: a line without a valid signature or out of sequence; no ``start``, ``items``
    or ``end`` record (the plugin never loaded, or the run ended early, e.g. ``os._exit``);
    a ``tamper`` record; an outcome for a node id pytest did not collect; a phase reported
    twice, or reported without the phase having run; a report that says ``passed`` while the
    phase raised or pytest built a report that did not pass; an expected failure (``XFAIL``)
    of a test that was not marked as one.
    """
    verdict = ChannelVerdict()
    bad = verdict.violations
    records = _signed_records(text, key, bad)
    kinds = [r["k"] for r in records]
    if not records or kinds[0] != "start":
        bad.append("the channel has no start record: the sandlot pytest plugin did not run")
        return verdict
    verdict.runner = [str(p) for p in records[0].get("runner") or []]
    if "items" not in kinds:
        bad.append("the channel has no record of the collected tests")
    if kinds[-1] != "end":
        bad.append("the channel has no end-of-session record: pytest did not finish")
    else:
        verdict.exitstatus = records[-1].get("exitstatus")
    items: set[str] = set()
    expected_xfail: set[str] = set()
    phases: dict[str, list[dict[str, Any]]] = {}
    seen: set[tuple[str, str]] = set()
    tampered: set[tuple[str, ...]] = set()
    for record in records:
        kind = record["k"]
        if kind == "items":
            items = set(record.get("ids", []))
            expected_xfail = set(record.get("xfail", []))
            verdict.code_files = dict(record.get("code_files", {}))
        elif kind == "tamper" and tuple(record.get("what", [])) not in tampered:
            tampered.add(tuple(record.get("what", [])))
            bad.append(
                f"pytest's machinery was changed ({record.get('where')}): "
                + "; ".join(record.get("what", []))
            )
        elif kind == "plugin":
            verdict.plugin_files.append(str(record.get("file")))
        elif kind == "wrapper":
            verdict.wrapper_files.setdefault(str(record.get("id")), []).append(
                str(record.get("file"))
            )
        elif kind == "phase":
            bad.extend(_phase_violations(record, items, expected_xfail, seen))
            phases.setdefault(record["id"], []).append(record)
    verdict.statuses = {
        nodeid: status for nodeid, recs in phases.items() if (status := _status(recs))
    }
    return verdict


def _phase_violations(
    record: Mapping[str, Any],
    items: set[str],
    expected_xfail: set[str],
    seen: set[tuple[str, str]],
) -> Iterable[str]:
    nodeid, when = record["id"], record["when"]
    where = f"{nodeid} ({when})"
    if nodeid not in items:
        yield f"outcome reported for {nodeid}, which pytest did not collect"
    if (nodeid, when) in seen:
        yield f"{where} was reported twice"
    seen.add((nodeid, when))
    if record["raw"] == "missing" or record["inner"] == "missing":
        yield f"{where} was reported without pytest running that phase"
    if record["outer"] == "passed" and (record["raw"] is not None or record["inner"] != "passed"):
        yield (
            f"{where} was reported passed although the phase "
            + ("raised" if record["raw"] is not None else f"was reported {record['inner']}")
        )
    if (
        record["outer"] == "skipped"
        and record["wasxfail"]
        and nodeid not in expected_xfail
        and record["raw"] != "xfail"
    ):
        yield f"{where} was reported as an expected failure but is not marked xfail"


def _status(phases: list[dict[str, Any]]) -> str | None:
    found = []
    for p in phases:
        outer, when, xf = p["outer"], p["when"], p["wasxfail"]
        if outer == "failed":
            found.append("FAILED" if when == "call" else "ERROR")
        elif outer == "skipped" and when != "teardown":
            found.append("XFAIL" if xf else "SKIPPED")
        elif outer == "passed" and when == "call":
            found.append("XPASS" if xf else "PASSED")
    return min(found, key=_SEVERITY.index) if found else None
