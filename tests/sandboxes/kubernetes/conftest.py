"""A fake Kubernetes API server per test module (``fakes.fake_kubernetes``), its fault knobs
reset for each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from fakes.shared import kubernetes_fake_unavailable
from requirements import need

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeKubernetes]:
    reason = kubernetes_fake_unavailable()
    need(reason is None, str(reason))
    from fakes.fake_kubernetes import FakeKubernetes

    fake = FakeKubernetes().start()
    yield fake
    fake.stop()


@pytest.fixture
def kube(cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubernetes]:
    """The module's fake cluster, its knobs at their defaults, this test's run id set."""
    monkeypatch.setenv("SANDLOT_RUN_ID", "run-kubernetes-test")
    yield cluster
    cluster.known_images = None
    cluster.unschedulable = None
    cluster.schedule_latency_s = cluster.pull_latency_s = cluster.fault_rate = 0.0
    cluster.v4_only = False
    cluster.lost_creates = cluster.dropped_watches = 0
