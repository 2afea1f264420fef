"""Chaos: 200 sandboxes of each cloud backend through the STARTING cap while 30 % of the
service's calls fail at random. Every sandbox either runs a command or is reported with a
``SandboxError``; the run completes; nothing is leaked (the fake's inventory is empty once
every sandbox is closed).

``modal``: the fake ``modal`` module fails creates, execs, polls and terminates with
Modal's transient errors (``InternalError``, ``ConnectionError``, ``ResourceExhaustedError``,
grpclib's ``StreamTerminatedError``). ``vefaas``: the fake control plane (the real SDK on the
wire) fails CreateSandbox, DescribeSandbox, ListSandboxes and KillSandbox with every fault it
knows: refused, read timeouts and dropped answers after the call took effect, 429, 500,
``RequestLimitExceeded`` in a 200, creates answered without a ``SandboxId``, creates that take
effect only after the client gave up (``stall``), and calls accepted but never answered
(``blackhole``); its ListSandboxes ignores the metadata filter, with sandboxes of another run
beside ours that must survive; and SWE-ReX servers restart (0.5 s without answers) or die
(the control plane still says ``Running``) while commands run. Its instances run
``tests/fakes/mini_swerex.py`` (the two SWE-ReX routes sandlot needs to start and run a
command) instead of a full ``swerex.server``, so that 200 of them start in seconds on two cores.
``kubernetes``: the fake API server (the real client on the wire) fails creates (500, 429,
refused, and taken effect but unanswered), reads, deletes and exec upgrades, and drops
watches; its pods are bubblewrap jails.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from repo_paths import TESTS
from requirements import bwrap_missing, need

from sandlot import SandboxError, SandboxSpec
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.scale.starting import StartLimits

# 11-31 s each on two busy cores (200 jails and their kill scripts): run with `-m ""`.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

N = 200
MINI_SWEREX = TESTS / "fakes" / "mini_swerex.py"
FAILURE_RATE = 0.3
LIMITS = StartLimits(max_attempts=6, backoff_s=0.01, backoff_max_s=0.2, budget_s=120)
MAX_STARTING = 16  # the process's STARTING cap (SANDLOT_MAX_STARTING) in these tests


async def _drive(sandboxes: list[Sandbox]) -> tuple[int, list[BaseException]]:
    """Start each sandbox, run one command, close it; count what ran, collect what failed."""
    ran = 0
    reported: list[BaseException] = []

    async def one(sb: Sandbox) -> None:
        nonlocal ran
        try:
            async with sb:
                r = await sb.exec("echo ran")
                assert r.stdout == "ran\n", r
                ran += 1
        except SandboxError as exc:
            reported.append(exc)

    with anyio.fail_after(840):  # a hang guard under each test's pytest-timeout
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(one, sb)
    kinds = sorted({type(e).__name__ for e in reported})
    print(f"chaos: {ran} ran, {len(reported)} reported ({', '.join(kinds)})")
    return ran, reported


@pytest.fixture
def quiet_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    # Hundreds of expected warnings: keep them out of the terminal, not out of the test.
    with caplog.at_level(logging.ERROR):
        yield


async def test_modal_chaos(monkeypatch: pytest.MonkeyPatch, quiet_logs: None) -> None:
    need(bwrap_missing() is None, str(bwrap_missing()))
    from fakes.fake_modal import FakeModal
    from fakes.shared import FakeModalSandbox

    from sandlot.sandboxes.modal import ModalOptions

    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    monkeypatch.setenv("SANDLOT_RUN_ID", "run-modal-chaos")
    monkeypatch.setenv("SANDLOT_MAX_STARTING", str(MAX_STARTING))
    fake = FakeModal()
    fake.create_latency_s = 0.02
    fake.schedule_latency_s = 0.05
    fake.fault_rate = FAILURE_RATE
    monkeypatch.setattr(FakeModalSandbox, "fake", fake)
    try:
        spec = SandboxSpec(image="python:3.12", start_limits=LIMITS)
        sandboxes: list[Sandbox] = [FakeModalSandbox(spec, ModalOptions()) for _ in range(N)]
        ran, reported = await _drive(sandboxes)
        assert ran + len(reported) == N
        assert ran > N // 2, f"only {ran} ran: {reported[:3]}"
        assert len(fake.faults_served) > N // 2  # the chaos really happened
        print(f"modal chaos: {len(fake.faults_served)} faults, {len(fake.sandboxes)} created")
        assert fake.peak_creating <= MAX_STARTING
        assert not fake.live(), f"leaked: {[s.object_id for s in fake.live()]}"
    finally:
        fake.close()


async def test_vefaas_chaos(monkeypatch: pytest.MonkeyPatch, quiet_logs: None) -> None:
    from fakes.shared import vefaas_fake_unavailable

    reason = vefaas_fake_unavailable()
    need(reason is None, str(reason))
    import shlex

    from fakes.fake_vefaas import FakeVefaas

    from sandlot.sandboxes.labels import RUN_ID
    from sandlot.sandboxes.vefaas import VefaasOptions, VefaasSandbox
    from sandlot.sandboxes.vefaas.config import credentials
    from sandlot.sandboxes.vefaas.control import ControlPlane

    monkeypatch.setenv("SANDLOT_RUN_ID", "run-vefaas-chaos")
    monkeypatch.setenv("SANDLOT_MAX_STARTING", str(MAX_STARTING))
    fake = FakeVefaas().start()
    fake.create_latency_s = 0.02
    fake.kill_delay_s = 0.01
    fake.hang_s = 0.6
    server = MINI_SWEREX
    bootstrap = (
        "mkdir -p {workdir} || exit 1; "
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(server))} {{token}}"
    )
    options: dict[str, Any] = {
        **fake.options(),
        "bootstrap": bootstrap,
        "control_timeout_s": 0.3,
        "ready_timeout_s": 30.0,
        "create_settle_s": 2.0,  # a stalled create lands 0.6 s after it was sent
    }
    try:
        # Another run's sandboxes, which a listing that ignores its filter returns too. They are
        # created before the chaos, by a control plane with the default timeouts: the 0.3 s of
        # the sandboxes under test is about the faults, not about a busy machine's first calls.
        opts = VefaasOptions(**options)
        setup_opts = VefaasOptions(**{**options, "control_timeout_s": 60.0})
        control = ControlPlane(credentials(setup_opts), setup_opts)
        bystanders = [
            await control.create(
                control.create_request(
                    SandboxSpec(image="python:3.12", timeout_s=600, labels={RUN_ID: "another-run"}),
                    function_id=opts.function_id or "",
                    command="exec sleep 600",
                    port=8000,
                ),
                lambda _: None,
            )
            for _ in range(3)
        ]
        fake.ignore_filters = True
        fake.chaos(FAILURE_RATE)
        spec = SandboxSpec(image="python:3.12", start_limits=LIMITS)
        sandboxes: list[Sandbox] = [VefaasSandbox(spec, opts) for _ in range(N)]
        restarts = 0

        async def restart_servers() -> None:
            # Every 0.1 s a running instance's server restarts; every 10th one dies.
            nonlocal restarts
            while True:
                await anyio.sleep(0.1)
                ours = [i for i in fake.live() if i.id not in bystanders]
                if ours:
                    restarts += 1
                    fake.server_down(fake.rng.choice(ours).id, 0.5 if restarts % 10 else 1e9)

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_servers)
            ran, reported = await _drive(sandboxes)
            tg.cancel_scope.cancel()
        assert ran + len(reported) == N
        assert ran > N // 2, f"only {ran} ran: {reported[:3]}"
        served = {f for _, f in fake.faults_served}
        assert {"timeout", "dropped", "no_id", "error_body", "stall", "blackhole"} <= served
        print(
            f"vefaas chaos: {len(fake.faults_served)} faults, {len(fake.instances)} created, "
            f"{restarts} server restarts or deaths"
        )
        assert fake.peak_starting <= MAX_STARTING
        await anyio.sleep(0.2)  # kills are asynchronous on the service
        leaked = [i.id for i in fake.leaked() if i.id not in bystanders]
        assert not leaked, f"leaked: {leaked}"
        assert all(not fake.instances[i].kill_requested for i in bystanders), "killed another run's"
    finally:
        fake.stop()


# 200 pods of the fake cluster on two cores that another xdist worker shares: up to minutes.
@pytest.mark.timeout(900)
async def test_kubernetes_chaos(monkeypatch: pytest.MonkeyPatch, quiet_logs: None) -> None:
    from fakes.shared import kubernetes_fake_unavailable

    reason = kubernetes_fake_unavailable()
    need(reason is None, str(reason))
    from fakes.fake_kubernetes import FakeKubernetes

    from sandlot.sandboxes.kubernetes import KubernetesOptions, KubernetesSandbox

    monkeypatch.setenv("SANDLOT_RUN_ID", "run-kubernetes-chaos")
    monkeypatch.setenv("SANDLOT_MAX_STARTING", str(MAX_STARTING))
    fake = FakeKubernetes().start()
    fake.schedule_latency_s = 0.05
    try:
        opts = KubernetesOptions(**fake.options(), create_timeout_s=5.0, delete_grace_s=0)
        fake.fault_rate = FAILURE_RATE
        spec = SandboxSpec(image="python:3.12", start_limits=LIMITS)
        sandboxes: list[Sandbox] = [KubernetesSandbox(spec, opts) for _ in range(N)]
        ran, reported = await _drive(sandboxes)
        assert ran + len(reported) == N
        assert ran > N // 2, f"only {ran} ran: {reported[:3]}"
        served = {f for _, f in fake.faults_served}
        assert {"500", "429", "refused", "lost", "dropped"} <= served
        print(f"kubernetes chaos: {len(fake.faults_served)} faults, {len(fake.pods)} pods left")
        assert fake.peak_pending <= MAX_STARTING
        fake.fault_rate = 0.0
        await anyio.sleep(0.5)  # deletions finish on the server's side
        assert not fake.live(), f"leaked: {fake.live()}"
    finally:
        fake.stop()
