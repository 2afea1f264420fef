"""Masked samples stay out of the GRPO/RLOO baseline: verl's own estimators on the real samples,
reached through verl's registry and ``compute_advantage`` as the trainer calls them."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import numpy as np
import pytest
from requirements import TRAIN, need_module

need_module("verl.trainer.ppo.core_algos", TRAIN)

import torch  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from sandlot.rollout.trajectory import EpisodeSetups  # noqa: E402
from sandlot.sandboxes.setups.counts import SetupCounts  # noqa: E402
from sandlot.trainer import advantage, setup_counts  # noqa: E402

LENGTH = 4


def batch(rewards: list[float], masked: list[bool], groups: list[str]) -> DataProto:
    """One outcome reward at each sample's last real token; a masked sample's mask is all 0,
    as :func:`sandlot.trainer.mapping.to_agent_loop_output` makes it."""
    mask = torch.ones(len(rewards), LENGTH)
    for i, m in enumerate(masked):
        if m:
            mask[i] = 0
    scores = torch.zeros(len(rewards), LENGTH)
    scores[:, -1] = torch.tensor(rewards)
    return DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array(groups, dtype=object)},
    )


def test_the_issue_example_gives_the_real_samples_zero_advantage() -> None:
    example = dict(
        rewards=[1.0, 0.0, 1.0, 1.0], masked=[False, True, False, False], groups=["a"] * 4
    )
    # verl's own GRPO counts the masked 0: the real samples look better than their group.
    plain = compute_advantage(batch(**example), adv_estimator="grpo", config=AlgoConfig())
    assert plain.batch["advantages"][0, -1] == pytest.approx(0.5, abs=1e-4)
    ours = compute_advantage(batch(**example), adv_estimator="sandlot_grpo", config=AlgoConfig())
    assert torch.count_nonzero(ours.batch["advantages"]) == 0
    assert advantage.last_stats == advantage.MaskedStats(
        samples=4, masked=1, groups=1, groups_without_baseline=0
    )
    assert advantage.last_stats.as_metrics()["sandlot/masked_samples"] == 1.0


def test_each_call_takes_the_set_ups_counted_since_the_last() -> None:
    setup_counts.take()  # whatever an earlier test left
    group = EpisodeSetups(
        agent=SetupCounts(set_up=1, forked=3), grading=SetupCounts(set_up=1, forked=4)
    )
    anyio.run(setup_counts.add, group)
    data = batch([1.0, 0.0], [False, False], ["a", "a"])
    compute_advantage(data, adv_estimator="sandlot_grpo", config=AlgoConfig())
    assert advantage.last_setups == group
    compute_advantage(data, adv_estimator="sandlot_grpo", config=AlgoConfig())
    assert advantage.last_setups == EpisodeSetups()


def test_real_samples_match_verls_grpo_on_the_unmasked_group() -> None:
    data = batch([1.0, 0.0, 0.0, 1.0, 0.0], [False, True, False, False, False], ["a"] * 5)
    ours = compute_advantage(data, adv_estimator="sandlot_grpo", config=AlgoConfig())
    alone = batch([1.0, 0.0, 1.0, 0.0], [False] * 4, ["a"] * 4)
    verl = compute_advantage(alone, adv_estimator="grpo", config=AlgoConfig())
    got = ours.batch["advantages"][:, -1].tolist()
    want = verl.batch["advantages"][:, -1].tolist()
    assert got[1] == 0.0
    assert [got[0], got[2], got[3], got[4]] == pytest.approx(want)
    assert ours.batch["advantages"][:, :-1].abs().sum() > 0  # broadcast over the real tokens


def test_fully_masked_and_baseline_less_groups_contribute_nothing() -> None:
    data = batch(
        [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        [True, True, False, True, False, False, False],
        ["dead", "dead", "lonely", "lonely", "ok", "ok", "single"],
    )
    out = compute_advantage(data, adv_estimator="sandlot_grpo", config=AlgoConfig())
    adv = out.batch["advantages"][:, -1].tolist()
    assert adv[:4] == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] > 0 > adv[5]
    assert adv[6] == pytest.approx(1.0)  # n=1 keeps verl's rule (the raw score)
    assert advantage.last_stats == advantage.MaskedStats(
        samples=7, masked=3, groups=4, groups_without_baseline=2
    )


def test_dr_grpo_and_rloo_use_verls_formulas_on_real_samples() -> None:
    example = dict(
        rewards=[1.0, 0.0, 0.0, 1.0], masked=[False, True, False, False], groups=["a"] * 4
    )
    dr = compute_advantage(
        batch(**example),
        adv_estimator="sandlot_grpo",
        config=AlgoConfig(norm_adv_by_std_in_grpo=False),
    )
    assert dr.batch["advantages"][:, -1].tolist() == pytest.approx([1 / 3, 0.0, -2 / 3, 1 / 3])
    rloo = compute_advantage(batch(**example), adv_estimator="sandlot_rloo", config=AlgoConfig())
    # RLOO over the three real samples: r_i - mean(others).
    assert rloo.batch["advantages"][:, -1].tolist() == pytest.approx([0.5, 0.0, -1.0, 0.5])


def test_verl_registers_the_estimators_through_its_plugin_entry_point() -> None:
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "print(get_adv_estimator_fn('sandlot_grpo').__module__, "
        "get_adv_estimator_fn('sandlot_rloo').__name__)\n"
    )
    # Shipped as a Ray working_dir (no entry point): runtime_env.yaml's module list does it.
    modules = {
        **os.environ,
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "VERL_USE_EXTERNAL_MODULES": "sandlot.trainer.advantage",
    }
    neither = {**modules, "VERL_USE_EXTERNAL_MODULES": ""}
    # Three fresh interpreters (verl reads the switches when imported), started together: each
    # spends ~7 s of CPU importing verl, the runs are independent.
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for env in (None, modules, neither)
    ]
    try:
        (plugin, plugin_err), (listed, listed_err), (_, unregistered_err) = [
            run.communicate(timeout=120) for run in runs
        ]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert runs[0].returncode == 0, plugin_err
    assert plugin.split() == ["sandlot.trainer.advantage", "masked_rloo_advantage"]
    assert runs[1].returncode == 0, listed_err
    assert listed.split()[0] == "sandlot.trainer.advantage"
    # So the two switches are what register it:
    assert "Unknown advantage estimator" in unregistered_err
    assert core_algos.get_adv_estimator_fn("sandlot_grpo") is advantage.masked_grpo_advantage
