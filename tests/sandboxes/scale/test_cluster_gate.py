"""The cluster-wide STARTING cap: the lease table, and the named Ray actor when Ray is here."""

from __future__ import annotations

import sys

import anyio
import pytest
from requirements import TRAIN, need_module

from sandlot.sandboxes.scale.cluster_gate import SlotTable, cluster_slot
from sandlot.sandboxes.scale.starting import ray_is_running


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_capacity_renewal_release_and_expiry() -> None:
    clock = Clock()
    table = SlotTable(clock)
    assert table.try_acquire("a", 2, lease_s=10) and table.try_acquire("b", 2, lease_s=10)
    assert not table.try_acquire("c", 2, lease_s=10)
    assert table.try_acquire("a", 2, lease_s=10), "a holder renews its own lease"
    table.release("b")
    assert table.try_acquire("c", 2, lease_s=10) and table.held() == 2
    clock.now += 11  # a worker killed while starting: its lease runs out
    assert table.held() == 0
    assert table.try_acquire("d", 1, lease_s=10)
    table.release("never-held")


def test_ray_is_not_imported_to_check_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert not ray_is_running()
    assert "ray" not in sys.modules


@pytest.mark.slow
def test_named_actor_caps_starting_across_the_cluster() -> None:
    ray = need_module("ray", TRAIN)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="sandlot-test")
    try:
        assert ray_is_running()
        holding = peak = 0

        async def start_one() -> None:
            nonlocal holding, peak
            async with cluster_slot(2, lease_s=60):
                holding += 1
                peak = max(peak, holding)
                await anyio.sleep(0.1)
                holding -= 1

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(start_one)

        anyio.run(main)
        assert peak == 2
        actor = ray.get_actor("sandlot-starting-gate", namespace="sandlot")
        assert ray.get(actor.held.remote()) == 0
    finally:
        import sandlot.sandboxes.scale.cluster_gate as gate

        gate._actor = None
        ray.shutdown()
