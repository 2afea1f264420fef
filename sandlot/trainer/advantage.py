"""Group advantages that leave masked samples out of the baseline.

A sample masked for an infrastructure failure (a sandbox that did not start or died, a failed
evaluation, a model-server error) reaches verl with an all-zero ``response_mask`` and reward 0
(:mod:`sandlot.trainer.mapping`). verl's own GRPO and RLOO estimators
(``verl/trainer/ppo/core_algos.py``, 0.9.1) still count that 0 in its group's mean and std: with
rewards ``[1, 0 (masked), 1, 1]`` the three real samples get +0.5 instead of 0, and a flaky
backend reads as "the other samples did well".

The estimators registered here run verl's own functions on the real samples only:

* ``sandlot_grpo``: :func:`verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`
  (``algorithm.norm_adv_by_std_in_grpo`` honoured; ``False`` is Dr.GRPO);
* ``sandlot_rloo``: :func:`verl.trainer.ppo.core_algos.compute_rloo_outcome_advantage`.

A masked sample gets advantage 0. A group left with fewer than two real samples (out of two or
more) contributes nothing: it has no baseline, and verl's rule for a group of one (the raw score
as advantage) would let the surviving sample's reward through uncentred. A group that was sampled
with ``n=1`` keeps verl's rule.

A sample is masked when its ``response_mask`` has no 1: the estimator's inputs in verl 0.9.1
(``token_level_rewards``, ``response_mask``, ``index``, ``config``) carry nothing else, and a
sample with no trained token has nothing to learn from its reward anyway.

Registration: verl imports the ``verl.plugins`` entry-point group on ``import verl`` in every
process (``verl/__init__.py``); sandlot declares this module there (``pyproject.toml``), and
``VERL_USE_EXTERNAL_MODULES=sandlot.trainer.advantage`` does the same where sandlot is shipped as
a Ray ``working_dir`` instead of installed. verl 0.9.1 has no hook for extra step metrics, so each
call logs its :class:`MaskedStats` and the step's sandbox set-ups and forks
(:mod:`sandlot.trainer.setup_counts`) (``sandlot.trainer`` logger, INFO) and keeps the last ones
in :data:`last_stats` and :data:`last_setups`; the per-sample flags are the ``masked`` and
``setups`` columns of the batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from sandlot.rollout.trajectory import EpisodeSetups
from sandlot.trainer import setup_counts

log = logging.getLogger("sandlot.trainer")

GRPO = "sandlot_grpo"
RLOO = "sandlot_rloo"
ESTIMATORS = (GRPO, RLOO)


@dataclass(frozen=True)
class MaskedStats:
    """One advantage computation's count of masked samples (a training step's batch).

    Attributes:
        samples: rows in the batch.
        masked: rows whose ``response_mask`` is all zero (left out of every baseline).
        groups: prompts (distinct ``index`` values).
        groups_without_baseline: groups of two or more rows with fewer than two real samples
            (all their advantages are 0), all-masked groups included.
    """

    samples: int
    masked: int
    groups: int
    groups_without_baseline: int

    def as_metrics(self) -> dict[str, float]:
        """The numbers under ``sandlot/`` metric names."""
        return {
            "sandlot/masked_samples": float(self.masked),
            "sandlot/masked_ratio": self.masked / self.samples if self.samples else 0.0,
            "sandlot/groups_without_baseline": float(self.groups_without_baseline),
        }


last_stats: MaskedStats | None = None
"""The stats of the last call in this process (the trainer's)."""

last_setups: EpisodeSetups | None = None
"""The sandboxes set up and forked since the call before (:mod:`sandlot.trainer.setup_counts`),
as the last call logged them."""


def _kept(response_mask: torch.Tensor, index: np.ndarray) -> tuple[np.ndarray, MaskedStats]:
    """Which rows enter the group statistics, and the counts."""
    real = (response_mask.sum(dim=-1) > 0).cpu().numpy()
    keys = [str(i) for i in index]
    size = Counter(keys)
    real_in = Counter(k for k, r in zip(keys, real, strict=True) if r)
    no_baseline = {k for k, n in size.items() if n > 1 and real_in[k] < 2}
    kept = np.array([bool(r) and k not in no_baseline for k, r in zip(keys, real, strict=True)])
    stats = MaskedStats(
        samples=len(keys),
        masked=int((~real).sum()),
        groups=len(size),
        groups_without_baseline=len(no_baseline),
    )
    return kept, stats


def _on_real_samples(
    estimator: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    global last_stats, last_setups
    kept, stats = _kept(response_mask, np.asarray(index, dtype=object))
    last_stats = stats
    try:
        last_setups = setup_counts.take()
    except Exception as exc:  # a Ray error: the step's set-up counts are lost, nothing else
        log.warning("cannot read the step's set-up counts (%s)", exc)
        last_setups = None
    counted = setup_counts.as_metrics(last_setups) if last_setups is not None else {}
    log.info("sandlot advantage: %s", {**stats.as_metrics(), **counted})
    advantages = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    if kept.any():
        rows = torch.from_numpy(kept).to(token_level_rewards.device)
        part, _ = estimator(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[kept],
            **kwargs,
        )
        advantages[rows] = part.to(advantages.dtype)
    return advantages, advantages


@core_algos.register_adv_est(GRPO)
def masked_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO outcome advantage over the real samples of each group (module docstring).

    Args:
        token_level_rewards: ``(batch, response_length)`` float tensor.
        response_mask: ``(batch, response_length)``; an all-zero row is a masked sample.
        index: ``(batch,)`` group ids (verl's ``uid``).
        epsilon: added to the std before dividing.
        config: verl's ``AlgoConfig`` (its ``norm_adv_by_std_in_grpo``; default True).

    Returns:
        ``(advantages, returns)``, both ``(batch, response_length)``, equal (outcome reward).
    """
    norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    return _on_real_samples(
        core_algos.compute_grpo_outcome_advantage,
        token_level_rewards,
        response_mask,
        index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm,
    )


@core_algos.register_adv_est(RLOO)
def masked_rloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's RLOO outcome advantage (arXiv:2402.14740) over the real samples of each group.

    Arguments and result as :func:`masked_grpo_advantage`.
    """
    return _on_real_samples(
        core_algos.compute_rloo_outcome_advantage,
        token_level_rewards,
        response_mask,
        index,
        epsilon=epsilon,
        config=config,
    )
