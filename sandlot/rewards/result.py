"""``EvalResult``: the outcome of evaluating one ``model_patch`` against one instance."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from sandlot.sandboxes.setups.counts import SetupCounts


class EvalStatus(str, Enum):
    """How an evaluation ended. ``resolved``/``unresolved``/``timed_out`` completed grading."""

    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    TIMED_OUT = "timed_out"
    EMPTY_PATCH = "empty_patch"
    PATCH_FAILED = "error: patch failed to apply"
    ERROR = "error"

    @property
    def completed(self) -> bool:
        """``True`` when the tests ran and were graded (SWE-bench's "completed" instances)."""
        return self in (EvalStatus.RESOLVED, EvalStatus.UNRESOLVED, EvalStatus.TIMED_OUT)

    @property
    def is_error(self) -> bool:
        """``True`` for the statuses the SWE-bench run report counts under ``error_ids``."""
        return self in (EvalStatus.PATCH_FAILED, EvalStatus.ERROR)


class EvalFailure(str, Enum):
    """What an evaluation that ended in an error status failed at (the harness's
    ``infra_failure`` labels, advisory): tells the row's fault from the machinery's.

    ``environment``: the test environment could not be built or set up, or does not run the
    tests; ``repository``: the repository or ``base_commit`` could not be fetched;
    ``patch``: the model patch applies with no fallback; ``test_patch``: the instance's
    ``test_patch`` does not apply at ``base_commit``; ``instance``: the instance lacks
    what its evaluation needs (no test command can be derived); ``infrastructure``: the
    sandbox or sandlot failed (a re-run may pass).
    """

    ENVIRONMENT = "environment"
    REPOSITORY = "repository"
    PATCH = "patch"
    TEST_PATCH = "test_patch"
    INSTANCE = "instance"
    INFRASTRUCTURE = "infrastructure"


class TestOutcome(BaseModel):
    """Success/failure split of one test list (the harness's ``tests_status`` entries)."""

    success: list[str] = Field(default_factory=list)
    failure: list[str] = Field(default_factory=list)


class RevertedFile(BaseModel):
    """A path of the model's changes undone before the tests ran, and why (see
    ``sandlot.rewards.integrity.policy``)."""

    path: str
    reason: str


class ChannelState(str, Enum):
    """What the pytest channel (``sandlot.rewards.integrity.channel``) said about the run."""

    VERIFIED = "verified"  # records complete and consistent: statuses graded from them
    VIOLATED = "violated"  # records missing, forged or contradicting: not resolved
    UNAVAILABLE = "unavailable"  # the test command does not run pytest (or checks were off)


class Integrity(BaseModel):
    """Which defences against forged results ran for one evaluation, and what they found.

    Attributes:
        channel: the pytest channel's state; ``None`` when the tests did not run.
        channel_note: why the channel was unavailable.
        reverted_files: how many of the model's files were reverted (listed in
            ``EvalResult.reverted_files``).
        log_consistent: the test log agrees with the channel on every FAIL_TO_PASS and
            PASS_TO_PASS test it mentions (``None`` without a channel).
        lingering_stopped: in the agent's own sandbox, how many processes the agent left
            running were killed before the tests ran (``None``: a fresh sandbox, or the caller
            did not stop them; see ``sandlot.rewards.lingering``).
        violations: reasons the run was not trusted; any makes the instance unresolved.
    """

    channel: ChannelState | None = None
    channel_note: str = ""
    reverted_files: int = 0
    log_consistent: bool | None = None
    lingering_stopped: int | None = None
    violations: list[str] = Field(default_factory=list)

    @property
    def triggered(self) -> bool:
        """A defence changed or rejected something (files reverted, run distrusted)."""
        return bool(
            self.reverted_files
            or self.violations
            or self.log_consistent is False
            or self.channel is ChannelState.VIOLATED
        )


class EvalResult(BaseModel):
    """Everything known about one evaluation.

    Attributes:
        instance_id: the instance evaluated.
        model_name_or_path: the model that wrote the patch (``"gold"`` for reference patches).
        status: how it ended (see ``EvalStatus``).
        resolved: every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passed (RESOLVED_FULL).
        reward: 1.0 when resolved, else 0.0.
        patch_applied: the model patch applied with one of the fallbacks.
        patch_apply_command: the command that applied it (``git apply --verbose``, ...).
        tests_status: per-test status parsed from the log (``PASSED``, ``FAILED``, ...).
        FAIL_TO_PASS / PASS_TO_PASS: success and failure lists, as the harness reports them.
        tests_exit_code: exit status of the test command (``None`` when it did not run).
        tests_timed_out: the test command hit ``eval_timeout``.
        log_warnings: reasons the log was distrusted (conflicting or spoofed statuses).
        reverted_files: the model's changes to test infrastructure undone before the tests.
        integrity: which defences ran and what they found (see ``Integrity``).
        error: what went wrong for error statuses, naming the step and what to do.
        failure: the cause of an error status (``None`` for the others).
        timings_s: seconds spent per step (``setup``, ``apply``, ``tests``, ``total``).
        setup: whether this evaluation set its sandbox up (``set_up``), started it as a fork
            of the instance's clean set-up (``forked``), or both (the evaluation that set a
            shared set-up up runs in a fork of it); 0 and 0 when no sandbox was opened.
        log: the test command's output (combined stdout and stderr).
    """

    instance_id: str
    model_name_or_path: str = ""
    status: EvalStatus
    resolved: bool = False
    reward: float = 0.0
    patch_applied: bool = False
    patch_apply_command: str | None = None
    tests_status: dict[str, str] = Field(default_factory=dict)
    FAIL_TO_PASS: TestOutcome = Field(default_factory=TestOutcome)
    PASS_TO_PASS: TestOutcome = Field(default_factory=TestOutcome)
    tests_exit_code: int | None = None
    tests_timed_out: bool = False
    log_warnings: list[str] = Field(default_factory=list)
    reverted_files: list[RevertedFile] = Field(default_factory=list)
    integrity: Integrity = Field(default_factory=Integrity)
    error: str | None = None
    failure: EvalFailure | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    setup: SetupCounts = Field(default_factory=SetupCounts)
    log: str = ""
