"""Apply the rules of :mod:`sandlot.rollout.audit.rules` to one episode: its flags, each with
the turn and command that raised it."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence

from pydantic import BaseModel, Field

from sandlot.datasets.instance import Instance
from sandlot.rewards.result import ChannelState, EvalResult
from sandlot.rollout.audit.calls import Call, episode_calls, prompt_text
from sandlot.rollout.audit.rules import RULES, Rule, Source
from sandlot.rollout.trajectory import Trajectory

MIN_HIDDEN_CHARS = 12
"""Shortest line of a patch (stripped) that :attr:`Source.HIDDEN_LINES` looks for: shorter
ones (``pass``, ``return x``, ``else:``) are everywhere in the code the agent may read."""

_SHA = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")
_BACKGROUND = re.compile(r"(?<![&>|])&(?![&>])|\b(?:nohup|setsid|disown)\b")
_DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(.+?)\s*$")


class Flag(BaseModel):
    """One finding.

    Attributes:
        rule: the rule's name.
        turn: the turn of the call that raised it (``None``: the grader's record).
        command: that call as one command line (``None`` likewise).
        detail: what matched (the text, the commit id, the line, the grader's fact).
    """

    rule: str
    turn: int | None = None
    command: str | None = None
    detail: str


class EpisodeAudit(BaseModel):
    """The flags of one episode.

    Attributes:
        instance_id / sample: which episode.
        reward: its reward.
        flags: every flag, in rule order then call order.
        unchecked: rules not applied, for the instance was unknown (no dataset).
    """

    instance_id: str
    sample: int
    reward: float = 0.0
    flags: list[Flag] = Field(default_factory=list)
    unchecked: list[str] = Field(default_factory=list)

    @property
    def rules(self) -> list[str]:
        """The names of the rules that flagged it, without repeats."""
        return list(dict.fromkeys(f.rule for f in self.flags))


def graded_alternation(instance: Instance) -> str:
    """The ``{graded}`` placeholder for ``instance``: each graded artefact, absolute and
    relative to ``workdir``, escaped, longest first; ``""`` when it has none."""
    forms: set[str] = set()
    for path in instance.graded_artefacts():
        forms.add(path)
        rel = posixpath.relpath(path, instance.workdir)
        if not rel.startswith(".."):
            forms.add(rel)
    return "|".join(re.escape(p) for p in sorted(forms, key=lambda p: (-len(p), p)))


def added_lines(patch: str) -> Iterator[tuple[str, str]]:
    """``(file, line)`` for each line a unified diff adds that is at least
    :data:`MIN_HIDDEN_CHARS` long (stripped) and is not also one of its removed or context
    lines (those are in the code the agent starts from)."""
    seen_before: set[str] = set()
    added: list[tuple[str, str]] = []
    path = ""
    for raw in patch.splitlines():
        match = _DIFF_FILE.match(raw)
        if match:
            path = match[1]
        elif raw.startswith("+"):
            added.append((path, raw[1:].strip()))
        elif raw[:1] in (" ", "-") and not raw.startswith("---"):
            seen_before.add(raw[1:].strip())
    for path, line in dict.fromkeys(added):
        if len(line) >= MIN_HIDDEN_CHARS and line not in seen_before:
            yield path, line


def _touches(call: Call, path: str) -> bool:
    """``call`` may have changed the repository file ``path``: an editor edit of it, or a
    ``bash`` command naming its file name."""
    if call.edits:
        return call.path == path or call.path.endswith("/" + path)
    return call.tool in ("bash", "execute_bash") and posixpath.basename(path) in call.command


def _patterns(rule: Rule, instance: Instance | None) -> list[re.Pattern[str]] | None:
    """The rule's compiled patterns, placeholders filled; ``None`` when it cannot run here
    (it needs the instance, or its placeholder is empty for this instance)."""
    patterns = list(rule.patterns)
    if "{graded}" in "".join(patterns):
        graded = graded_alternation(instance) if instance else ""
        if not graded:
            return None
        patterns = [p.replace("{graded}", graded) for p in patterns]
    try:
        return [re.compile(p, re.MULTILINE) for p in patterns]
    except re.error as exc:
        raise ValueError(f"audit rule {rule.name!r}: a pattern is not a regex ({exc})") from None


def _command_flags(rule: Rule, calls: Sequence[Call], found: list[re.Pattern[str]]) -> list[Flag]:
    flags = []
    for call in calls:
        for pattern in found:
            match = pattern.search(call.command)
            if match:
                flags.append(
                    Flag(
                        rule=rule.name,
                        turn=call.turn,
                        command=call.command,
                        detail=match[0].strip(),
                    )
                )
                break
    return flags


def _unseen_sha_flags(
    rule: Rule,
    traj: Trajectory,
    calls: Sequence[Call],
    found: list[re.Pattern[str]],
    instance: Instance,
) -> list[Flag]:
    shown = prompt_text(traj).lower()
    base = instance.base_commit.lower()
    flags = []
    for call in calls:
        texts = [m[0] for p in found for m in p.finditer(call.command)]
        unseen = [
            sha
            for text in texts
            for sha in _SHA.findall(text)
            if not sha.isdigit() and not base.startswith(sha) and sha not in shown
        ]
        if unseen:
            detail = f"commit {', '.join(dict.fromkeys(unseen))} was never shown in the sandbox"
            flags.append(Flag(rule=rule.name, turn=call.turn, command=call.command, detail=detail))
        shown += "\n" + call.output.lower()
    return flags


def _hidden_line_flags(rule: Rule, calls: Sequence[Call], instance: Instance) -> list[Flag]:
    patch = "\n".join(getattr(instance, name) for name in rule.patterns)
    hidden = list(added_lines(patch))
    flags = []
    written = ""
    touched: set[str] = set()
    for call in calls:
        written += "\n" + call.written
        touched.update(path for path, _ in hidden if _touches(call, path))
        shown = [
            (path, line)
            for path, line in hidden
            if path not in touched and line not in written and line in call.output
        ]
        if shown:
            path, line = shown[0]
            more = f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""
            flags.append(
                Flag(
                    rule=rule.name,
                    turn=call.turn,
                    command=call.command,
                    detail=f"{path}: {line}{more}",
                )
            )
    return flags


def grader_facts(result: EvalResult | None, calls: Sequence[Call] = ()) -> list[str]:
    """What the grader recorded, one fact a line (see :attr:`Source.GRADER`).

    The count of lingering processes includes the agent's own shell session (one or two
    processes), so its line also says how many of ``calls`` started something in the
    background: ``lingering: <n> killed after <k> background command(s)``.
    """
    if result is None:
        return []
    integrity = result.integrity
    facts = [f"reverted {r.path}: {r.reason}" for r in result.reverted_files]
    facts += [f"violation: {v}" for v in integrity.violations]
    facts += [f"log warning: {w}" for w in result.log_warnings]
    if integrity.channel is ChannelState.VIOLATED:
        facts.append("channel: violated")
    if integrity.log_consistent is False:
        facts.append("log: inconsistent")
    if integrity.lingering_stopped is not None:
        background = sum(1 for c in calls if _BACKGROUND.search(c.command))
        facts.append(
            f"lingering: {integrity.lingering_stopped} killed after {background} background "
            "command(s)"
        )
    return facts


def _evidence_call(fact: str, calls: Sequence[Call]) -> Call | None:
    """The call behind a grader's fact: the last one that may have changed a reverted file;
    the first that started a process in the background for lingering processes."""
    if fact.startswith("reverted "):
        path = fact.removeprefix("reverted ").split(":", 1)[0]
        return next((c for c in reversed(calls) if _touches(c, path)), None)
    if fact.startswith("lingering: "):
        return next((c for c in calls if _BACKGROUND.search(c.command)), None)
    return None


def _grader_flags(
    rule: Rule, traj: Trajectory, calls: Sequence[Call], found: list[re.Pattern[str]]
) -> list[Flag]:
    flags = []
    for fact in grader_facts(traj.eval, calls):
        if any(p.search(fact) for p in found):
            call = _evidence_call(fact, calls)
            flags.append(
                Flag(
                    rule=rule.name,
                    turn=call.turn if call else None,
                    command=call.command if call else None,
                    detail=fact,
                )
            )
    return flags


def audit_episode(
    traj: Trajectory, instance: Instance | None, rules: Iterable[Rule] = RULES
) -> EpisodeAudit:
    """The flags of one episode.

    Args:
        traj: the episode.
        instance: its instance (``None``: unknown; the rules that need it are listed in
            ``unchecked``).
        rules: the table to apply (default :data:`~sandlot.rollout.audit.rules.RULES`).

    Raises:
        ValueError: a rule's pattern is not a regular expression (names the rule).
    """
    calls = episode_calls(traj)
    audit = EpisodeAudit(instance_id=traj.instance_id, sample=traj.sample, reward=traj.reward)
    for rule in rules:
        if instance is None:
            if rule.needs_instance:
                audit.unchecked.append(rule.name)
                continue
        elif rule.source is Source.HIDDEN_LINES:  # its patterns name patches: nothing to compile
            audit.flags += _hidden_line_flags(rule, calls, instance)
            continue
        found = _patterns(rule, instance)
        if found is None:
            continue
        if rule.source is Source.COMMAND:
            audit.flags += _command_flags(rule, calls, found)
        elif rule.source is Source.UNSEEN_SHA and instance is not None:
            audit.flags += _unseen_sha_flags(rule, traj, calls, found, instance)
        elif rule.source is Source.GRADER:
            audit.flags += _grader_flags(rule, traj, calls, found)
    return audit
