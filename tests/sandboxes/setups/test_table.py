"""``SetupTable``: who sets a key up, who waits, when a snapshot goes (no sandbox, no Ray)."""

from __future__ import annotations

from sandlot.sandboxes.setups.table import SetupTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_builder_per_key_and_a_dead_builder_is_given_up() -> None:
    clock = Clock()
    table: SetupTable[str] = SetupTable(clock=clock)
    assert table.claim("k", "a", lease_s=10) == "build"
    assert table.claim("k", "b", lease_s=10) == "wait"
    clock.now += 8
    assert table.renew("k", "a", lease_s=10)
    clock.now += 8
    assert table.claim("k", "b", lease_s=10) == "wait", "a renewed its build"
    clock.now += 3  # a stopped renewing: its process died
    assert table.claim("k", "b", lease_s=10) == "failed"
    assert not table.renew("k", "a", lease_s=10)
    assert table.publish("k", "a", "snap", group_size=None, lease=None) == ["snap"], "given up"
    assert table.acquire("k", "lease") is None


def test_a_snapshot_is_deleted_when_evicted_and_no_fork_holds_it() -> None:
    table: SetupTable[str] = SetupTable(max_snapshots=1)
    for key in ("a", "b"):
        assert table.claim(key, "builder", lease_s=10) == "build"
    assert table.publish("a", "builder", "snap-a", group_size=None, lease=None) == []
    assert table.claim("a", "other", lease_s=10) == "ready"
    assert table.acquire("a", "fork-1") == "snap-a"
    assert table.publish("b", "builder", "snap-b", group_size=None, lease=None) == [], "held"
    assert table.acquire("a", "fork-2") is None, "evicted: set up alone"
    assert table.claim("a", "again", lease_s=10) == "build"
    assert table.release("fork-1") == ["snap-a"]
    assert table.release("fork-1") == []
    assert table.claim("b", "x", lease_s=10) == "ready"
    assert table.publish("a", "again", None, group_size=None, lease=None) == []
    assert table.claim("a", "x", lease_s=10) == "failed"
    assert table.close() == ["snap-b"]


def test_a_key_is_dropped_once_its_group_opened() -> None:
    table: SetupTable[str] = SetupTable()
    table.claim("k", "builder", lease_s=10)
    table.publish("k", "builder", "snap", group_size=3, lease=None)
    assert table.acquire("k", "f1") == "snap" and table.acquire("k", "f2") == "snap"
    assert table.acquire("k", "f3") is None
    assert table.release("f1") == [] and table.release("f2") == ["snap"]
    assert table.close() == []


def test_a_builder_that_forks_holds_its_own_lease() -> None:
    """``fork_first``: the builder's own fork counts as the group's first open and holds the
    snapshot, so a group of two keeps it until both forks closed."""
    table: SetupTable[str] = SetupTable()
    table.claim("k", "builder", lease_s=10)
    assert table.publish("k", "builder", "snap", group_size=2, lease="own") == []
    assert table.acquire("k", "sibling") == "snap"
    assert table.claim("k", "late", lease_s=10) == "build", "the group opened: a new set-up"
    assert table.release("own") == []
    assert table.release("sibling") == ["snap"]


def test_drop_evicts_an_instances_finished_keys() -> None:
    table: SetupTable[str] = SetupTable()
    for key in ("i/local/a", "i/local/a/grading", "ii/local/a", "i/local/b"):
        table.claim(key, "builder", lease_s=10)
    table.publish("i/local/a", "builder", "snap-a", group_size=None, lease=None)
    table.publish("i/local/a/grading", "builder", "snap-g", group_size=None, lease="fork")
    table.publish("ii/local/a", "builder", "snap-ii", group_size=None, lease=None)
    assert table.drop("i/local/") == ["snap-a"], "the grading's is held by its fork"
    assert table.claim("i/local/b", "other", lease_s=10) == "wait", "a build is its builder's"
    assert table.claim("ii/local/a", "other", lease_s=10) == "ready"
    assert table.release("fork") == ["snap-g"]
