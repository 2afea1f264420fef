"""The agent loop core: one episode of one row, from sandbox start to reward.

The same function runs under ``sandlot rollout`` (an OpenAI-compatible :class:`Policy`) and
under verl (the trainer's token-in/token-out policy), so what is evaluated is what is trained.

An episode, as uni-agent's and SWE-agent's loops run it:

1. open the row's sandbox (``instance_spec`` + the config's ``sandbox`` block; the row's own
   environment wins), put the repository at ``base_commit``, run its setup and delete what
   grades the instance (:mod:`sandlot.rollout.graded`: hidden tests, their runner);
2. build the :class:`~sandlot.tools.Toolbox`; turns of policy → tool calls (native, or parsed
   from text with ``tool_parser``, never from inside the reasoning block) → tools →
   observations, until ``submit``/``finish``, a turn without a tool call, ``max_turns``,
   ``max_total_tokens``, a generation cut at its length or a conversation the model's context
   no longer holds (``ContextLengthError``), ``timeout_budget`` tool timeouts, or a dead
   sandbox;
3. take the model patch (what ``submit`` returned, else ``git diff`` against ``base_commit``);
4. grade it with :func:`~sandlot.rewards.evaluate` in a fresh sandbox (``reward.mode:
   fresh``; with a set-up cache, a fork of the instance's clean set-up, which the first
   grading of the instance makes) or in the agent's sandbox (``same``; the graded files are
   put back from a host copy first, and the trajectory warns that processes the agent left
   could touch them).

Every sandbox is closed on every path. :func:`run_episode` never raises but for cancellation:
a failed start, a failed setup or a model-server failure is a trajectory with
``exit_reason=infra_error`` (``retryable`` says whether running it again may help).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.datasets.prompts import PROMPT_FIELDS, PromptLeakError, find_leak
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.errors import SandboxError
from sandlot.rewards.evaluation import evaluate, evaluate_in_sandbox
from sandlot.rewards.lingering import ProcessBaseline, stop_lingering
from sandlot.rollout.config import AgentConfig
from sandlot.rollout.generation import GenerationConfig
from sandlot.rollout.graded import GradedFiles, remove_graded, restore_graded
from sandlot.rollout.policy import ContextLengthError, Message, Policy, PolicyError, PolicyTurn
from sandlot.rollout.trajectory import ExitReason, Step, ToolObservation, Trajectory
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.sandboxes.setups.cache import SetupCache, setup_key
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.tools import Toolbox, ToolCall, ToolContext, ToolError, get_parser
from sandlot.tools.submit import diff_against_base

log = logging.getLogger("sandlot.rollout")

REDACTED = "[REDACTED]"


class _Timer:
    """Seconds per phase, accumulated into one dict (verl's ``simple_timer`` idea)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.monotonic() - started


def episode_spec(row: TaskRow, config: AgentConfig, backend: str) -> SandboxSpec:
    """The sandbox of ``row`` on ``backend``: the config's spec defaults under the row's own
    environment (image, workdir, environment recipe, env vars, network, labels).

    Raises:
        ValueError: the row's image map has no image for ``backend``.
    """
    instance = row.instance
    from_row = instance_spec(instance, backend)
    fields = dict(config.sandbox.spec)
    fields.update(
        image=from_row.image,
        workdir=from_row.workdir,
        environment=from_row.environment,
        env={**fields.get("env", {}), **from_row.env},
        network=bool(fields.get("network")) or from_row.network,
        labels={**fields.get("labels", {}), **from_row.labels},
    )
    return SandboxSpec.model_validate(fields)


def render_prompt(row: TaskRow, config: AgentConfig) -> list[Message]:
    """The first messages: the row's ``prompt``, with the config's templates replacing the
    system and/or user message (``str.format`` over the instance's ``PROMPT_FIELDS``).

    Raises:
        PromptLeakError: the rendered prompt contains the gold patch or the test patch.
    """
    messages: list[Message] = [m.model_dump() for m in row.prompt]
    fields = {name: getattr(row.instance, name) for name in PROMPT_FIELDS}
    for role in ("system", "user"):
        template = getattr(config.prompt, role)
        if template is None:
            continue
        content = template.format_map(fields)
        messages = [m for m in messages if m["role"] != role]
        at = 0 if role == "system" else len(messages)
        messages.insert(at, {"role": role, "content": content})
    leak = find_leak(messages, row.instance)
    if leak:
        raise PromptLeakError(f"{row.instance.instance_id}: the prompt contains the {leak}")
    return messages


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def _redact_value(value: Any, secrets: list[str]) -> Any:
    """``value`` (tool-call arguments: JSON values) with every string redacted."""
    if isinstance(value, str):
        return _redact(value, secrets)
    if isinstance(value, dict):
        return {k: _redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(v, secrets) for v in value]
    return value


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n[... {dropped} characters elided ...]\n{text[-half:]}"


class _ResponseBudget:
    """``generation.response_length`` counted as training counts it: every token after the
    first prompt, the replies' and the observations'. Over HTTP they are known from each
    reply's ``usage`` (``prompt_tokens`` includes the observations so far)."""

    def __init__(self, generation: GenerationConfig) -> None:
        self.generation = generation
        self.first_prompt: int | None = None
        self.used = 0

    def next_max_tokens(self) -> int | None:
        return self.generation.next_max_tokens(self.used)

    def spent_before(self, reply: PolicyTurn) -> bool:
        """The observations since the last reply, counted only now, had spent the budget:
        training, which counts them before it asks, would not have asked for this reply."""
        if self.first_prompt is None:
            self.first_prompt = reply.prompt_tokens
        limit = self.generation.response_length
        return limit is not None and reply.prompt_tokens - self.first_prompt >= limit

    def spent_after(self, reply: PolicyTurn) -> bool:
        """The reply used the rest of the budget (training cuts it there: ``length``)."""
        self.used = reply.prompt_tokens + reply.completion_tokens - (self.first_prompt or 0)
        limit = self.generation.response_length
        return limit is not None and self.used >= limit


class _Episode:
    """The state of one running episode (one handler per phase; termination in one place)."""

    def __init__(
        self, row: TaskRow, policy: Policy, config: AgentConfig, backend: str, sample: int
    ) -> None:
        self.row, self.policy, self.config, self.backend = row, policy, config, backend
        self.instance: Instance = row.instance
        self.timer = _Timer()
        self.secrets = [s for s in policy.secrets() if s]
        self.traj = Trajectory(
            instance_id=self.instance.instance_id, sample=sample, exit_reason=ExitReason.INFRA_ERROR
        )
        self.timeouts = 0

    def end(self, reason: ExitReason, error: str | None = None) -> None:
        self.traj.exit_reason = reason
        self.traj.error = _redact(error, self.secrets) if error else None

    async def run_turns(self, sb: Sandbox) -> None:
        inter = self.config.interaction
        context = ToolContext(
            sb, repo_dir=self.instance.workdir, base_commit=self.instance.base_commit
        )
        toolbox = Toolbox.from_config(self.config.tool_specs(), context=context)
        schemas = toolbox.schemas()
        parser = get_parser(
            self.config.tool_parser, schemas, reasoning_opened=self.config.reasoning_opened
        )
        messages = self.traj.messages
        budget = _ResponseBudget(self.config.generation)
        for turn in range(1, inter.max_turns + 1):
            max_tokens = budget.next_max_tokens()
            if max_tokens is not None and max_tokens <= 0:
                return self.end(ExitReason.CONTEXT_LENGTH, "generation.response_length reached")
            # Passed only when set, so policies that know no budget need not take it.
            cap = {} if max_tokens is None else {"max_tokens": max_tokens}
            step = Step(turn=turn, content="")
            self.traj.steps.append(step)
            started = time.monotonic()
            try:
                with self.timer("model"):
                    reply = await self.policy.generate(messages, schemas, **cap)
            except ContextLengthError as exc:
                self.traj.steps.pop()
                return self.end(ExitReason.CONTEXT_LENGTH, str(exc))
            if budget.spent_before(reply):
                self.traj.steps.pop()
                return self.end(ExitReason.CONTEXT_LENGTH, "generation.response_length reached")
            step.model_s = time.monotonic() - started
            self.traj.num_turns = turn
            # The model cannot know a key unless one leaked; if it writes one, keep it out.
            content = _redact(reply.content, self.secrets)
            step.content = content
            step.prompt_tokens = reply.prompt_tokens
            step.completion_tokens = reply.completion_tokens
            usage = self.traj.usage
            usage.prompt_tokens += reply.prompt_tokens
            usage.completion_tokens += reply.completion_tokens
            usage.last_prompt_tokens = reply.prompt_tokens
            calls, error = self._calls(reply.content, reply.tool_calls, parser)
            messages.append(self._assistant_message(content, reply.tool_calls, turn))
            if reply.finish_reason == "length" or budget.spent_after(reply):
                return self.end(ExitReason.CONTEXT_LENGTH)
            if reply.prompt_tokens + reply.completion_tokens >= inter.max_total_tokens:
                return self.end(ExitReason.MAX_TOKENS)
            if error is not None:
                step.format_error = error
                self.traj.format_errors += 1
                messages.append({"role": "user", "content": error})
                continue
            if not calls:
                return self.end(ExitReason.NO_TOOL_CALL)
            started = time.monotonic()
            with self.timer("tools"):
                done = await self._run_calls(sb, toolbox, calls, reply.tool_calls is not None, step)
            step.tools_s = time.monotonic() - started
            malformed = [o.output for o in step.observations if o.status == "format_error"]
            if malformed:  # unknown tool, arguments not JSON or not valid for the tool
                step.format_error = malformed[0]
                self.traj.format_errors += 1
            if done is not None:
                return self.end(done)
            if self.timeouts >= inter.timeout_budget:
                return self.end(ExitReason.TIMEOUT_BUDGET)
        self.end(ExitReason.MAX_TURNS)

    @staticmethod
    def _calls(
        content: str, native: list[ToolCall] | None, parser: Any
    ) -> tuple[list[ToolCall], str | None]:
        if native is not None:
            return native, None
        parsed = parser.parse(content)
        return parsed.calls, parsed.error

    def _assistant_message(self, content: str, native: list[ToolCall] | None, turn: int) -> Message:
        message: Message = {"role": "assistant", "content": content}
        if native:
            message["tool_calls"] = [
                {
                    "id": f"call_{turn}_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": self._arguments_text(c)},
                }
                for i, c in enumerate(native)
            ]
        return message

    def _arguments_text(self, call: ToolCall) -> str:
        # Native arguments that did not decode stay the text the model wrote (a str).
        raw: Any = call.arguments
        text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
        return _redact(text, self.secrets)

    async def _run_calls(
        self, sb: Sandbox, toolbox: Toolbox, calls: list[ToolCall], native: bool, step: Step
    ) -> ExitReason | None:
        limit = self.config.interaction.max_observation_chars
        for i, call in enumerate(calls):
            started = time.monotonic()
            result = await toolbox.call(call.name, call.arguments)
            output = _clip(_redact(result.output, self.secrets), limit)
            step.observations.append(
                ToolObservation(
                    tool=call.name,
                    arguments=_redact_value(call.arguments, self.secrets),
                    output=output,
                    status=result.status,
                    duration_s=time.monotonic() - started,
                )
            )
            message: Message = {"role": "tool", "content": output}
            if native:
                message["tool_call_id"] = f"call_{step.turn}_{i}"
            self.traj.messages.append(message)
            if result.status == "timeout":
                self.timeouts += 1
                self.traj.tool_timeouts += 1
            if result.done:
                self.traj.model_patch = result.patch or ""
                return ExitReason.SUBMITTED if call.name == "submit" else ExitReason.FINISHED
            if result.status == "error" and not await sb.is_alive():
                return ExitReason.SANDBOX_DEAD
        return None

    async def take_patch(self, sb: Sandbox) -> None:
        if self.traj.exit_reason is ExitReason.SUBMITTED:
            return
        if not await sb.is_alive():
            return
        try:
            self.traj.model_patch = await diff_against_base(
                sb, self.instance.workdir, self.instance.base_commit
            )
        except (ToolError, SandboxError) as exc:
            log.warning("%s: no model patch: %s", self.instance.instance_id, exc)


_warned_same = False


async def _remove_graded(ep: _Episode, sb: Sandbox, copy_to: Path | None) -> GradedFiles:
    """Delete the instance's graded files from the agent's sandbox (copied to ``copy_to``
    first, for reward mode ``same``); record and log loudly what could not be deleted, and
    that mode ``same`` puts them back in the sandbox the agent had a shell in."""
    global _warned_same
    graded = await remove_graded(sb, ep.instance, copy_to=copy_to)
    leak = graded.leak_warning(ep.instance)
    if leak:
        ep.traj.warnings.append(leak)
        log.warning("GRADED FILES READABLE BY THE AGENT: %s", leak)
    if graded.copies:
        ep.traj.warnings.append(
            "reward mode 'same': the graded files were deleted for the episode and are put "
            "back into the agent's sandbox for the grading; the processes the agent left are "
            "killed first, but what it changed outside the repository (the interpreter, "
            "installed packages, pytest) stays; use reward mode 'fresh' for training"
        )
        if not _warned_same:
            _warned_same = True
            log.warning(
                "reward mode 'same' grades %s and other instances with graded files in the "
                "agent's own sandbox, where it was root: what it changed outside the "
                "repository (the interpreter, installed packages, pytest) can change the "
                "result; use reward mode 'fresh' for training",
                ep.instance.instance_id,
            )
    return graded


async def run_episode(
    row: TaskRow,
    policy: Policy,
    config: AgentConfig,
    *,
    sample: int = 0,
    backend: str | None = None,
    model_name_or_path: str = "",
    sandbox_options: BaseModel | None = None,
    setups: SetupCache | None = None,
    group_size: int | None = None,
) -> Trajectory:
    """Run one episode of ``row`` with ``policy`` and grade it (see the module docstring).

    Args:
        row: the task (a verl parquet row; ``TaskRow.from_record`` reads one).
        policy: the model.
        config: the agent config.
        sample: which of the n samples of this row (recorded).
        backend: overrides the config's backend (``None``: ``config.sandbox.resolved_backend``).
        model_name_or_path: recorded in the trajectory and its ``EvalResult``.
        sandbox_options: overrides the config's options for the backend.
        setups: shares the set-ups of the row's samples (:mod:`sandlot.sandboxes.setups.cache`;
            ``reward.mode: fresh`` only): the agent's sandbox is a fork of the first sample's
            set-up sandbox, whose ``timings_s["setup"]`` then covers the start too, and the
            grading's a fork of the instance's clean set-up (``Trajectory.setups`` counts
            both).
        group_size: how many samples of the row open through ``setups`` (each snapshot is
            deleted once the last one opened); ``None``: kept until evicted.

    Returns:
        The :class:`Trajectory`; ``timings_s`` has ``start``, ``setup``, ``agent``, ``model``,
        ``tools``, ``eval`` and ``total`` in seconds.
    """
    started = time.monotonic()
    backend = backend or config.sandbox.resolved_backend()
    ep = _Episode(row, policy, config, backend, sample)
    traj, timer = ep.traj, ep.timer
    traj.model_name_or_path = model_name_or_path
    reward = config.reward
    evaluated = False
    same = reward.mode == "same"
    copies = tempfile.TemporaryDirectory(prefix="sandlot-graded-") if same else None
    try:
        options = sandbox_options or config.sandbox.options_for(backend)
        spec = episode_spec(row, config, backend)
        traj.messages = render_prompt(row, config)
        if setups is not None and not same:  # fresh grading: the samples share a set-up
            key = setup_key(ep.instance.instance_id, backend, spec, options)

            async def prepare(sb: Sandbox) -> None:
                traj.setups.agent.set_up += 1
                await prepare_repo(sb, ep.instance, backend)
                await _remove_graded(ep, sb, None)

            with timer("setup"):
                sb = await setups.open(key, backend, spec, options, prepare, group_size=group_size)
            traj.setups.agent.forked += sb.origin is not None
        else:
            sb = open_sandbox(backend, spec, options=options)
        try:
            if setups is None or same:
                with timer("start"):
                    await sb.start()
                with timer("setup"):
                    traj.setups.agent.set_up += 1
                    await prepare_repo(sb, ep.instance, backend)
                    graded = await _remove_graded(ep, sb, Path(copies.name) if copies else None)
                    # Before the first turn: nothing in it is the agent's (rewards.lingering).
                    baseline = await ProcessBaseline.take(sb) if same else None
                    if same and baseline is None:
                        traj.warnings.append(
                            "reward mode 'same' in a sandbox that shares this machine's "
                            "processes: what the agent leaves running cannot be stopped before "
                            "the grading"
                        )
            with timer("agent"):
                await ep.run_turns(sb)
            await ep.take_patch(sb)
            if same and traj.exit_reason is not ExitReason.SANDBOX_DEAD:
                with timer("eval"):
                    # Killed before the graded files are back, so none of them sees those.
                    stopped = await stop_lingering(sb, baseline) if baseline else None
                    await restore_graded(sb, graded)
                    traj.eval = await evaluate_in_sandbox(
                        sb,
                        ep.instance,
                        traj.model_patch,
                        model_name_or_path=model_name_or_path,
                        timeout=reward.eval_timeout,
                    )
                    traj.eval.integrity.lingering_stopped = stopped
                evaluated = True
        finally:
            await sb.close()
        if not evaluated:
            with timer("eval"):
                traj.eval = await evaluate(
                    ep.instance,
                    traj.model_patch,
                    backend=backend,
                    model_name_or_path=model_name_or_path,
                    timeout=reward.eval_timeout,
                    sandbox_options=options,
                    setups=setups,
                    group_size=group_size,
                )
                traj.setups.grading = traj.eval.setup
    except PolicyError as exc:
        ep.end(ExitReason.INFRA_ERROR, f"model server: {exc}")
        traj.retryable = exc.retryable
    except SandboxError as exc:
        ep.end(ExitReason.INFRA_ERROR, f"sandbox ({type(exc).__name__}): {exc}")
        traj.retryable = exc.retryable
    except (ValueError, KeyError, OSError) as exc:
        ep.end(ExitReason.INFRA_ERROR, f"{type(exc).__name__}: {exc}")
        traj.retryable = False
    except Exception as exc:  # one episode must never take down the batch
        log.exception("episode %s/%d failed unexpectedly", traj.instance_id, sample)
        ep.end(ExitReason.INFRA_ERROR, f"unexpected {type(exc).__name__}: {exc}")
        traj.retryable = False
    finally:
        if copies is not None:
            copies.cleanup()
    traj.reward = traj.eval.reward if traj.eval is not None else 0.0
    timer.timings["total"] = time.monotonic() - started
    traj.timings_s = timer.timings
    return traj
