"""The scale tests' fake backend: :mod:`sandlot.testing.simulated`, the provider the
benchmarks simulate too (latency, 429s, hangs), registered under its own name."""

from __future__ import annotations

from typing import ClassVar

from sandlot.testing import SimulatedCloud, SimulatedSandbox

Cloud = SimulatedCloud


class FakeCloudSandbox(SimulatedSandbox):
    """A simulated sandbox of the provider in :attr:`cloud` (replaced per test)."""

    name: ClassVar[str] = "fake-cloud"
    cloud: ClassVar[SimulatedCloud] = SimulatedCloud()
