"""End-of-run statistics of a rollout: pass@1, avg@n, pass@k with the unbiased estimator of
Chen et al. 2021, exit reasons, token totals and the time split."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from pydantic import BaseModel, Field

from sandlot.rollout.record import EpisodeRecord
from sandlot.rollout.trajectory import TIMING_KEYS, EpisodeSetups, ExitReason


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"):
    ``1 - C(n-c, k) / C(n, k)``, computed as a product for numerical stability.

    Raises:
        ValueError: ``k`` is not in ``1..n`` or ``c`` not in ``0..n``.
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


class RolloutSummary(BaseModel):
    """End-of-run statistics over the latest trajectory of each episode.

    Attributes:
        episodes / instances: how many of each have a trajectory.
        samples: the most samples any instance has (the ``n`` of avg@n and pass@n).
        pass_at_1: resolved share of each instance's first sample: what ``predictions.jsonl``
            holds, and what ``sandlot eval`` of it reproduces.
        resolved_first: instances whose first sample is resolved (``pass_at_1`` as a count).
        avg_at_n: mean reward over every episode (the unbiased pass@1 estimate from n samples).
        pass_at_k: ``{"pass@k": value}`` for k = 1, 2, 4, ... and n, with the unbiased
            estimator, each over the instances that have at least k samples.
        resolved_episodes / resolved_instances: episodes resolved; instances with any resolved
            sample.
        exit_reasons / eval_statuses: counts.
        infra_errors: episodes that ended in ``infra_error`` (counted as unresolved above).
        retried: episodes that needed more than one attempt.
        mean_turns / format_errors: per episode mean; total turns with unreadable tool calls.
        prompt_tokens / completion_tokens: totals.
        mean_timings_s: mean seconds per phase (``queue``, ``start``, ``setup``, ``agent``,
            ``model``, ``tools``, ``eval``, ``total``), over the episodes that reached it.
        setups: the sandboxes set up and forked, the agents' and the gradings' (a group of n
            samples that shares its set-ups: 1 agent set-up and n - 1 forks, 1 grading set-up
            and n forks).
    """

    episodes: int = 0
    instances: int = 0
    samples: int = 0
    pass_at_1: float = 0.0
    resolved_first: int = 0
    avg_at_n: float = 0.0
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    resolved_episodes: int = 0
    resolved_instances: int = 0
    exit_reasons: dict[str, int] = Field(default_factory=dict)
    eval_statuses: dict[str, int] = Field(default_factory=dict)
    infra_errors: int = 0
    retried: int = 0
    mean_turns: float = 0.0
    format_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    mean_timings_s: dict[str, float] = Field(default_factory=dict)
    setups: EpisodeSetups = Field(default_factory=EpisodeSetups)


def _ks(n: int) -> list[int]:
    ks = {n}
    k = 1
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def summarize(records: Iterable[EpisodeRecord]) -> RolloutSummary:
    """The :class:`RolloutSummary` of ``records`` (one per episode)."""
    by_instance: dict[str, dict[int, EpisodeRecord]] = defaultdict(dict)
    episodes = 0
    rewards = 0.0
    turns = 0
    timing_sums: dict[str, float] = defaultdict(float)
    timing_counts: Counter[str] = Counter()
    summary = RolloutSummary()
    exits: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for r in records:
        by_instance[r.instance_id][r.sample] = r
    for samples in by_instance.values():
        for r in samples.values():
            episodes += 1
            rewards += r.reward
            turns += r.num_turns
            summary.resolved_episodes += r.resolved
            summary.format_errors += r.format_errors
            summary.retried += r.attempts > 1
            summary.prompt_tokens += r.prompt_tokens
            summary.completion_tokens += r.completion_tokens
            summary.setups += r.setups
            exits[r.exit_reason.value] += 1
            if r.eval_status is not None:
                statuses[r.eval_status] += 1
            for key, value in r.timings_s.items():
                timing_sums[key] += value
                timing_counts[key] += 1
    if not episodes:
        return summary
    n = max(len(s) for s in by_instance.values())
    summary.episodes = episodes
    summary.instances = len(by_instance)
    summary.samples = n
    summary.avg_at_n = rewards / episodes
    summary.mean_turns = turns / episodes
    summary.resolved_first = sum(s[min(s)].resolved for s in by_instance.values())
    summary.pass_at_1 = summary.resolved_first / len(by_instance)
    summary.resolved_instances = sum(
        any(r.resolved for r in s.values()) for s in by_instance.values()
    )
    for k in _ks(n):
        eligible = [s for s in by_instance.values() if len(s) >= k]
        summary.pass_at_k[f"pass@{k}"] = sum(
            pass_at_k(len(s), sum(r.resolved for r in s.values()), k) for s in eligible
        ) / len(eligible)
    summary.exit_reasons = dict(exits.most_common())
    summary.eval_statuses = dict(statuses.most_common())
    summary.infra_errors = exits.get(ExitReason.INFRA_ERROR.value, 0)
    order = {key: i for i, key in enumerate(TIMING_KEYS)}
    summary.mean_timings_s = {
        key: timing_sums[key] / timing_counts[key]
        for key in sorted(timing_sums, key=lambda k: (order.get(k, len(order)), k))
    }
    return summary
