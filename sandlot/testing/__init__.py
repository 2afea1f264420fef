"""Stand-ins for cloud providers, for tests and benchmarks of sandlot's scale controls.

Shipped with the library (not kept under ``tests/``) because the benchmarks import them as
plainly as the tests do, and because a user tuning ``SANDLOT_MAX_STARTING`` or a scheduler can
run the same simulation without a cloud account. Nothing here touches the network.
"""

from sandlot.testing.simulated import InstantSession, SimulatedCloud, SimulatedSandbox

__all__ = ["InstantSession", "SimulatedCloud", "SimulatedSandbox"]
