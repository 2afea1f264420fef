"""``sandlot audit``: flag the episodes of a rollout that cheat, with the turn and command.

* :mod:`~sandlot.rollout.audit.rules`: the table of rules (names, sources, patterns);
* :mod:`~sandlot.rollout.audit.calls`: an episode as a list of command lines;
* :mod:`~sandlot.rollout.audit.check`: one episode's flags;
* :mod:`~sandlot.rollout.audit.run`: a run directory's flags, counted, as ``audit.json``.

``docs/audit.md`` describes each rule and its false positives.
"""

from sandlot.rollout.audit.check import EpisodeAudit, Flag, audit_episode
from sandlot.rollout.audit.rules import RULES, Rule, Source
from sandlot.rollout.audit.run import AUDIT_FILE, AuditReport, audit_run, audit_trajectories

__all__ = [
    "AUDIT_FILE",
    "RULES",
    "AuditReport",
    "EpisodeAudit",
    "Flag",
    "Rule",
    "Source",
    "audit_episode",
    "audit_run",
    "audit_trajectories",
]
