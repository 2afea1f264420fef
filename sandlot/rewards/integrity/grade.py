"""Grade a run from its pytest channel, and check that the log tells the same story."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from sandlot.datasets.instance import Instance
from sandlot.rewards.grading import Grade, LogParser, grade_statuses, parser_context
from sandlot.rewards.integrity.channel import ChannelVerdict


@dataclass
class ChannelGrade:
    """The grade from the channel's statuses, whether the log agrees, and why not."""

    grade: Grade
    log_consistent: bool
    violations: list[str]


def as_parser_ids(
    statuses: dict[str, str], parser: LogParser, instance: Instance
) -> dict[str, str]:
    """Channel statuses keyed as the instance's log parser keys them (the ids of
    ``FAIL_TO_PASS``/``PASS_TO_PASS``): each is written as the ``-rA`` line pytest would print
    (``PASSED <node id>``) and parsed with that parser."""
    return _parsed(statuses, parser, instance)[0]


_WORST_FIRST = ("ERROR", "FAILED", "SKIPPED", "XPASS", "XFAIL", "PASSED")


def _parsed(
    statuses: dict[str, str], parser: LogParser, instance: Instance
) -> tuple[dict[str, str], list[str]]:
    """:func:`as_parser_ids` and the violations of the node ids: one holding a line break
    (pytest escapes them in ids: only a forged id has one) or parsing to more than one test
    would let one channel record speak for other tests. Two node ids the parser keys alike
    (it cuts at the first space: ``test_a[x y]`` and ``test_a[x z]``) keep the worst status."""
    context = parser_context(instance)
    out: dict[str, str] = {}
    bad: list[str] = []
    for nodeid, status in statuses.items():
        if "\n" in nodeid or "\r" in nodeid:
            bad.append(f"the channel node id {nodeid!r} holds a line break")
            continue
        try:
            parsed = parser(f"{status} {nodeid}", context)
        except Exception:  # a parser that needs more context than one line: id kept as is
            parsed = {nodeid: status}
        if len(parsed) > 1:
            bad.append(f"the channel node id {nodeid!r} reads as {len(parsed)} tests")
            continue
        for key, value in parsed.items():
            known = out.get(key)
            if known is None or _rank(value) < _rank(known):
                out[key] = value
    return out, bad


def _rank(status: str) -> int:
    return _WORST_FIRST.index(status) if status in _WORST_FIRST else 0


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def runner_package_file(path: str, runner: Iterable[str], workdir: str) -> bool:
    """``True`` when ``path`` is a file of the runner's own packages and the runner is the
    repository: pytest-dev/pytest (or pluggy) installed from its work tree.

    ``runner`` is what the signed ``start`` record says the bootstrap imported from the
    repository because no pytest outside it could be imported (``_pytest``, ``pytest``,
    ``pluggy``: a package directory or a module file, inside ``workdir``). A built-in plugin
    there (``src/_pytest/skipping.py``) is the code under test: its changes are the fix, not
    test machinery. Any other file loaded as a plugin (a conftest's module, a plugin outside
    those packages, in pytest's repository too) is not.
    """
    inside = [top for top in runner if _under(top, workdir) and top.rstrip("/") != workdir]
    return any(_under(path, top) for top in inside)


def grade_channel(
    instance: Instance,
    verdict: ChannelVerdict,
    *,
    parser: LogParser,
    log_statuses: dict[str, str],
    model_files: Iterable[str],
) -> ChannelGrade:
    """Grade ``instance`` from ``verdict``; compare with the log's statuses.

    Args:
        instance: the task (FAIL_TO_PASS, PASS_TO_PASS, workdir).
        verdict: the checked channel records of the run.
        parser: the instance's swebench log parser.
        log_statuses: the statuses parsed from the test log.
        model_files: repository-relative paths the model changed that were kept; one of them
            registered as a pytest plugin is a violation (the model wrote test machinery),
            unless the run's runner is the repository's own pytest and the file is one of
            that runner's package files (see :func:`runner_package_file`).
    """
    violations = list(verdict.violations)
    kept = set(model_files)
    for path in dict.fromkeys(verdict.plugin_files):
        rel = posixpath.relpath(path, instance.workdir)
        if rel in kept and not runner_package_file(path, verdict.runner, instance.workdir):
            violations.append(f"{rel}, changed by the model patch, was loaded as a pytest plugin")
    graded_ids = set(instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
    for nodeid, path in verdict.code_files.items():
        rel = posixpath.relpath(path, instance.workdir)
        if rel in kept and graded_ids & set(as_parser_ids({nodeid: "PASSED"}, parser, instance)):
            violations.append(f"the code of test {nodeid} comes from {rel}, changed by the model")
    for nodeid, paths in verdict.wrapper_files.items():
        for path in dict.fromkeys(paths):
            rel = posixpath.relpath(path, instance.workdir)
            if rel in kept:
                violations.append(
                    f"test {nodeid} is wrapped by code of {rel}, changed by the model"
                )
    statuses, bad_ids = _parsed(verdict.statuses, parser, instance)
    violations += bad_ids
    graded = grade_statuses(instance, statuses)
    consistent = True
    for test in dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS):
        logged = log_statuses.get(test)
        if logged is not None and logged != statuses.get(test):
            consistent = False
            violations.append(
                f"the log reports {test} as {logged} but the channel as "
                f"{statuses.get(test, 'not run')}"
            )
    return ChannelGrade(grade=graded, log_consistent=consistent, violations=violations)
