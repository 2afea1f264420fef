"""The channel's statuses keyed as the instance's log parser keys them: one node id may speak
only for its own test."""

from __future__ import annotations

from repo_paths import EXAMPLES
from requirements import EVAL, need_module

from sandlot.datasets.loaders import load_instances
from sandlot.datasets.swebench_specs import resolve_log_parser
from sandlot.rewards.integrity.channel import ChannelVerdict
from sandlot.rewards.integrity.grade import grade_channel

need_module("swebench", EVAL)

INSTANCES = EXAMPLES / "swe-mini" / "instances.jsonl"


def _grade(statuses: dict[str, str]) -> tuple[bool, list[str]]:
    inst = next(i for i in load_instances(INSTANCES) if i.instance_id == "minicalc__minicalc-1")
    everyone = {t: "PASSED" for t in inst.PASS_TO_PASS}
    verdict = ChannelVerdict(statuses=everyone | statuses)
    graded = grade_channel(
        inst, verdict, parser=resolve_log_parser(inst), log_statuses={}, model_files=[]
    )
    return graded.grade.resolved, graded.violations


def test_a_node_id_that_reads_as_another_test_is_a_violation() -> None:
    inst = next(i for i in load_instances(INSTANCES) if i.instance_id == "minicalc__minicalc-1")
    f2p = inst.FAIL_TO_PASS[0]
    assert _grade({f2p: "PASSED"}) == (True, [])  # control: the real id passes
    _, bad = _grade({f"{f2p.rsplit('::', 1)[0]}::test_x[a\nPASSED {f2p} ]": "PASSED"})
    assert any("line break" in v for v in bad), bad


def test_ids_the_parser_keys_alike_keep_the_worst_status() -> None:
    inst = next(i for i in load_instances(INSTANCES) if i.instance_id == "minicalc__minicalc-1")
    f2p = inst.FAIL_TO_PASS[0]
    resolved, bad = _grade({f2p: "FAILED", f"{f2p} x": "PASSED"})
    assert not resolved and bad == []
