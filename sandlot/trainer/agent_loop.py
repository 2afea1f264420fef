"""``SandlotAgentLoop``: the rollout core under verl, token-in/token-out.

verl (0.9.x) builds one agent loop per sample inside its ``AgentLoopWorker`` Ray actors (from the
``agent_loop_config_path`` YAML that ``sandlot train`` writes) and awaits
``run(sampling_params, **row)``. This loop parses the row (:meth:`TaskRow.from_record`), runs
:func:`sandlot.rollout.run_episode` with a :class:`TokenPolicy` over verl's
``server_manager.generate``, and maps the trajectory and its token buffer to verl's
``AgentLoopOutput`` (:func:`sandlot.trainer.mapping.to_agent_loop_output`).

Token bookkeeping (the rules of verl's ``docs/extend_guide.rst`` and ``ToolAgentLoop``):

* one ``request_id`` per trajectory, so every turn is routed to the same server (prefix cache;
  the fully-async client resumes an aborted generation under it);
* the prompt is rendered once with ``ct_build_initial_tokens``; each turn's sampled tokens are
  appended as returned with ``ct_merge_assistant_token`` (mask 1, the server's log-probs); the
  tool observations and user messages the core appends are rendered with
  ``ct_merge_context_msg`` (mask 0, log-prob 0.0). Decoded text is only read (tool-call parsing,
  the trajectory), never encoded again;
* ``response_length`` is the whole trajectory's budget: each request's ``max_tokens`` is what is
  left (capped by ``generation.max_tokens``), a turn that reaches it (``stop_reason``
  ``length``) ends the episode, and the output is cut to it;
* the ``generation`` block of ``agent_config.yaml`` (:mod:`sandlot.rollout.generation`, the
  one ``sandlot rollout`` samples with) is laid over verl's: ``temperature``, ``top_p``, ``stop``
  and ``extra_body`` over ``sampling_params``, ``chat_template_kwargs`` over
  ``data.apply_chat_template_kwargs``; a ``generation.response_length`` other than verl's
  ``rollout.response_length`` is an error naming both;
* ``min_global_steps``/``max_global_steps`` come from ``TokenOutput.extra_fields``;
* ``routed_experts`` (MoE router replay) are the last call's, cut to prompt + response as
  verl's ``ToolAgentLoop`` cuts them;
* with ``check_drift: true`` in the YAML entry, each sample's buffer is compared with the chat
  template's rendering of its messages (:mod:`sandlot.trainer.drift`), and
  ``extra_fields["drift_tokens"]`` counts the tokens after the first difference (off by
  default: one more rendering of the whole conversation per sample).

Groups: verl runs the ``rollout.n`` samples of a prompt as concurrent ``run`` calls of one
``AgentLoopWorker`` (its fully async rollouter sends a prompt's n copies to one worker; the
synchronous manager splits the batch into contiguous chunks, so a group is split only where a
chunk boundary cuts it). With ``n > 1`` and ``reward.mode: fresh`` they share one set-up for
their agents and one for their gradings through the worker process's
:class:`~sandlot.sandboxes.setups.cache.SetupCache` (one per event loop): the first sample sets
up and snapshots, the others fork, each snapshot is deleted once the group's n samples opened
it, and an instance's set-ups are released when the worker has no sample of it running any
more (validation prompts, sampled ``val_kwargs.n`` times); ``extra_fields["setups"]`` says how
each sample's sandboxes came to be, and each step's sums are logged by the trainer
(:mod:`sandlot.trainer.setup_counts`). What is left at the worker's exit is deleted by an
``atexit`` hook, and ``sandlot gc --run-id`` removes what a killed worker left.

A sample never raises (but for cancellation): a sandbox that does not start, a failed
evaluation, a model-server error, an aborted generation (``partial_rollout=False``) or a bug of
ours becomes a masked sample (all-zero ``response_mask``, reward 0, the reason in
``extra_fields``). Which exit reasons are masked is configurable (``mask_exit_reasons``).
Tokenization and decoding run in an executor, so one sample's CPU work does not stall the
other trajectories of the worker's event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import threading
import traceback
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import ValidationError
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

from sandlot.datasets.rows import DEFAULT_AGENT_NAME, TaskRow
from sandlot.rollout.agent import run_episode
from sandlot.rollout.config import AgentConfig, load_agent_config
from sandlot.rollout.dump import TrajectoryDump
from sandlot.rollout.generation import GenerationConfig
from sandlot.rollout.policy import ContextLengthError, Message, PolicyError, PolicyTurn
from sandlot.rollout.trajectory import ExitReason, Trajectory
from sandlot.sandboxes.scale.starting import ray_is_running
from sandlot.sandboxes.setups.actor import SharedSetups
from sandlot.sandboxes.setups.cache import SetupCache
from sandlot.settings import settings
from sandlot.trainer import setup_counts
from sandlot.trainer.drift import check_drift, drifted_tokens
from sandlot.trainer.mapping import DEFAULT_MASKED_EXITS, TokenBuffer, to_agent_loop_output

log = logging.getLogger("sandlot.trainer")

AGENT_CONFIG_ENV = "SANDLOT_AGENT_CONFIG"
"""Where the loop finds ``agent_config.yaml`` when its YAML entry sets no ``agent_config``."""

_configs: dict[Path, AgentConfig] = {}
_configs_lock = threading.Lock()
_decode_pool: ThreadPoolExecutor | None = None
_last_global_steps: int | None = None
"""The policy version of the last generation in this worker process: recorded for samples that
failed before generating (verl needs a number)."""


_setups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SetupCache] = (
    weakref.WeakKeyDictionary()
)


def worker_setups() -> SetupCache:
    """The :class:`SetupCache` of this process's running event loop (verl's worker runs every
    sample on one loop); its snapshots are deleted at the process's exit."""
    loop = asyncio.get_running_loop()
    if loop not in _setups:
        if not _setups:
            atexit.register(_delete_snapshots)
        # Under Ray (verl's workers are actors) the workers of a node share each group's
        # set-up through the run's registry actor.
        _setups[loop] = SetupCache(shared=SharedSetups() if ray_is_running() else None)
    return _setups[loop]


_running: Counter[tuple[int, str]] = Counter()
"""Samples running per (cache, instance) in this process."""


@contextlib.asynccontextmanager
async def _in_batch(setups: SetupCache, instance_id: str, backend: str) -> AsyncIterator[None]:
    """One sample of ``instance_id`` runs; when the instance has none running any more (its
    batch ended), its set-ups are released. verl tells the loop no group size for validation
    prompts (``val_kwargs.n`` samples, not ``rollout.n``): their snapshots go here rather than
    when evicted; a training group's went when its ``rollout.n`` samples opened them."""
    key = (id(setups), instance_id)
    _running[key] += 1
    try:
        yield
    finally:
        _running[key] -= 1
        if not _running[key]:
            del _running[key]
            await setups.release(instance_id, backend)


def _delete_snapshots() -> None:
    """At exit: delete what the caches still hold (each removal runs without its loop, which
    is gone by now; a forced kill skips this, ``sandlot gc --run-id`` is the remedy)."""
    caches = list(_setups.values())
    _setups.clear()
    for cache in caches:
        try:
            asyncio.run(cache.aclose())
        except Exception:
            log.exception("deleting the group snapshots at exit failed; run `sandlot gc`")


def _decoder() -> ThreadPoolExecutor:
    # One thread: a fast tokenizer used from several threads at once can fail ("Already
    # borrowed"); one decode is fast, they only must not run on the event loop.
    global _decode_pool
    if _decode_pool is None:
        _decode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandlot-decode")
    return _decode_pool


def agent_config_at(path: str | os.PathLike[str]) -> AgentConfig:
    """``agent_config.yaml`` at ``path``, read once per process."""
    resolved = Path(path).expanduser().resolve()
    with _configs_lock:
        if resolved not in _configs:
            _configs[resolved] = load_agent_config(resolved)
        return _configs[resolved]


class TokenPolicy:
    """The :class:`~sandlot.rollout.policy.Policy` of one trajectory over verl's
    ``server_manager`` (see the module docstring); its :attr:`tokens` are the buffer
    :func:`~sandlot.trainer.mapping.to_agent_loop_output` maps.

    Args:
        loop: the agent loop (its ``ct_*`` helpers, ``server_manager`` and ``tokenizer``).
        sampling_params: for every request (verl's with the ``generation`` block laid over
            them; ``max_tokens`` is set per request).
        response_length: the trajectory's token budget after the prompt.
        request_id: sticky routing key (default: a new uuid4).
    """

    def __init__(
        self,
        loop: AgentLoopBase,
        sampling_params: Mapping[str, Any],
        *,
        response_length: int,
        request_id: str | None = None,
    ) -> None:
        self.loop = loop
        self.sampling_params = dict(sampling_params)
        self.response_length = response_length
        self.request_id = request_id or uuid4().hex
        self.want_logprobs = bool(self.sampling_params.get("logprobs"))
        self.tokens = TokenBuffer(response_logprobs=[] if self.want_logprobs else None)
        self._rendered = 0  # messages already in the token buffer (the reply included)
        self._messages: list[Message] = []  # the episode's conversation (the core's list)
        self.tools: list[dict[str, Any]] | None = None
        tokenizer = loop.tokenizer
        self._trailing_special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def secrets(self) -> list[str]:
        return []

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
    ) -> PolicyTurn:
        """The next turn from verl's server; ``max_tokens`` caps what is left of
        ``response_length`` (the buffer's count is exact, the agent loop's an estimate)."""
        tokens = self.tokens
        schemas: Any = tools or None  # verl's annotation says list; None means "no tools"
        self._messages, self.tools = messages, schemas
        if not tokens.prompt_ids:
            ids = await self.loop.ct_build_initial_tokens(_copy(messages), tools=schemas)
            tokens.prompt_ids, tokens.runtime_ids = list(ids), list(ids)
        elif len(messages) > self._rendered:
            previous = _copy(messages[: self._rendered])
            merged, mask, logprobs = await self.loop.ct_merge_context_msg(
                previous,
                _copy(messages),
                tokens.runtime_ids,
                tokens.response_mask,
                tokens.response_logprobs,
                tools=schemas,
            )
            tokens.runtime_ids, tokens.response_mask = list(merged.token_ids), list(mask)
            if self.want_logprobs:
                tokens.response_logprobs = list(logprobs or [])
        self._rendered = len(messages)
        left = self.response_length - len(tokens.response_mask)
        if left <= 0:
            raise ContextLengthError(f"response_length {self.response_length} reached")
        context = len(tokens.runtime_ids)
        output = await self.loop.server_manager.generate(
            self.request_id,
            prompt_ids=list(tokens.runtime_ids),
            sampling_params={
                **self.sampling_params,
                "max_tokens": left if max_tokens is None else min(left, max_tokens),
            },
        )
        sampled = [int(t) for t in output.token_ids]
        self._record_steps(output)
        if output.routed_experts is not None:
            tokens.routed_experts = output.routed_experts
        if output.stop_reason in ("aborted", "abort"):
            # partial_rollout=False: the client does not resume, the turn is cut short.
            raise PolicyError("generation aborted by a weight sync (partial_rollout=False)")
        returned = list(output.log_probs or [])
        if self.want_logprobs and sampled and len(returned) != len(sampled):
            raise PolicyError(
                f"log-probs were requested but the server returned {len(returned)} for "
                f"{len(sampled)} tokens",
                retryable=False,
            )
        merged, mask, logprobs = await self.loop.ct_merge_assistant_token(
            tokens.runtime_ids,
            sampled,
            tokens.response_mask,
            tokens.response_logprobs,
            assistant_logprobs=[float(x) for x in returned] if self.want_logprobs else None,
        )
        tokens.runtime_ids, tokens.response_mask = list(merged.token_ids), list(mask)
        if self.want_logprobs:
            tokens.response_logprobs = list(logprobs or [])
        tokens.num_generations += 1
        text = await asyncio.get_running_loop().run_in_executor(_decoder(), self._decode, sampled)
        self._rendered += 1  # the assistant message the agent loop appends next
        cut = output.stop_reason == "length" or len(tokens.response_mask) >= self.response_length
        return PolicyTurn(
            content=text,
            prompt_tokens=context,
            completion_tokens=len(sampled),
            finish_reason="length" if cut else "stop",
            extra={"global_steps": output.extra_fields.get("global_steps")},
        )

    def rendered_messages(self) -> list[Message]:
        """The messages the token buffer holds (the last reply included)."""
        return _copy(self._messages[: self._rendered])

    def _decode(self, ids: list[int]) -> str:
        """The reply's text: the stop token(s) at its end dropped, everything else as sampled
        (markup tokens such as ``<tool_call>`` included, for the tool-call parser)."""
        end = len(ids)
        while end and ids[end - 1] in self._trailing_special:
            end -= 1
        tokenizer: Any = self.loop.tokenizer
        text: str = tokenizer.decode(ids[:end], skip_special_tokens=False)
        return text

    def _record_steps(self, output: Any) -> None:
        global _last_global_steps
        fields = dict(output.extra_fields or {})
        extra = self.tokens.extra_fields
        if not extra:
            extra.update(fields)
        elif fields.get("max_global_steps") is not None:
            extra["max_global_steps"] = fields["max_global_steps"]
            extra["global_steps"] = fields.get("global_steps", extra.get("global_steps"))
        if output.num_preempted is not None:
            self.tokens.num_preempted = max(self.tokens.num_preempted, 0) + output.num_preempted
        steps = fields.get("max_global_steps", fields.get("global_steps"))
        if steps is not None:
            _last_global_steps = int(steps)


class SandlotAgentLoop(AgentLoopBase):
    """verl's agent loop for sandlot rows (register it through the ``agent_loop_config_path``
    YAML; :func:`sandlot.trainer.launch.write_agent_loop_config` writes one).

    Args:
        agent_config: path of ``agent_config.yaml`` (default: ``$SANDLOT_AGENT_CONFIG``).
        mask_exit_reasons: exit reasons whose samples are masked (default: ``infra_error``,
            ``sandbox_dead``); add e.g. ``max_turns``, ``context_length`` or ``timeout_budget``
            to train only on episodes the model ended itself.
        check_drift: compare each sample's buffer with the chat template's rendering
            (``extra_fields["drift_tokens"]``; module docstring).
        trajectory_dir: keep each sample's :class:`Trajectory` there, one file per worker
            process (:mod:`sandlot.rollout.dump`), for ``sandlot audit``; ``None``: kept nowhere.
        **kwargs: verl's constructor arguments (``trainer_config``, ``server_manager``,
            ``tokenizer``, ``processor``, ``dataset_cls``, ``data_config``, ``hf_model_type``,
            ``tools``, the YAML entry's ``name``).
    """

    def __init__(
        self,
        *args: Any,
        agent_config: str | None = None,
        mask_exit_reasons: Iterable[str] | None = None,
        check_drift: bool = False,
        trajectory_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        # verl passes the YAML entry's name and consumes the row's agent_name column.
        self.agent_name = str(kwargs.get("name") or DEFAULT_AGENT_NAME)
        super().__init__(*args, **kwargs)
        path = agent_config or settings().agent_config
        if not path:
            raise ValueError(
                f"SandlotAgentLoop needs agent_config (in the agent_loop_config_path YAML entry) "
                f"or ${AGENT_CONFIG_ENV}"
            )
        self.agent_config_path = str(path)
        reasons = DEFAULT_MASKED_EXITS if mask_exit_reasons is None else mask_exit_reasons
        self.masked_exits = tuple(ExitReason(r) for r in reasons)
        self.response_length = int(self.rollout_config.response_length)
        # A config that does not load, or does not fit verl's, masks every sample with the
        # reason (run() reports it) rather than killing verl's worker.
        self._config: AgentConfig | Exception
        try:
            self._config = agent_config_at(self.agent_config_path)
            self._use_generation(self._config.generation, kwargs.get("hf_model_type"))
        except (OSError, ValueError) as exc:
            self._config = exc
        self.check_drift = bool(check_drift)
        self.dump = TrajectoryDump(trajectory_dir) if trajectory_dir else None
        self.routing_replay = bool(self.rollout_config.get("enable_rollout_routing_replay", False))

    def _use_generation(self, generation: GenerationConfig, hf_model_type: str | None) -> None:
        """Check ``generation.response_length`` against verl's and render prompts with
        ``generation.chat_template_kwargs`` laid over verl's (the builder verl made is
        rebuilt the way ``AgentLoopBase.__init__`` builds it)."""
        wanted = generation.response_length
        if wanted is not None and wanted != self.response_length:
            raise ValueError(
                f"{self.agent_config_path}: generation.response_length={wanted} differs from "
                f"verl's actor_rollout_ref.rollout.response_length={self.response_length}; "
                "set them equal (or drop generation.response_length: training uses verl's)"
            )
        if not generation.chat_template_kwargs:
            return
        self.apply_chat_template_kwargs = {
            **dict(self.apply_chat_template_kwargs or {}),
            **generation.chat_template_kwargs,
        }
        self.continuous_token_builder = create_continuous_token_builder(
            self.tokenizer,
            hf_model_type=hf_model_type,
            chat_template_kwargs=self.apply_chat_template_kwargs,
            mm_processor_kwargs=self.mm_processor_kwargs,
            processor=self.processor,
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if isinstance(self._config, AgentConfig):
            sampling_params = self._config.generation.sampling_params(sampling_params)
        policy = TokenPolicy(self, sampling_params, response_length=self.response_length)
        try:
            traj = await self._episode(policy, kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one sample must never take down the worker
            log.exception("sandlot agent loop failed")
            traj = _failed(kwargs, f"agent loop: {type(exc).__name__}: {exc}")
            traj.error = f"{traj.error}\n{traceback.format_exc(limit=5)}"
        await setup_counts.add(traj.setups)
        if self.dump is not None:
            try:
                await self.dump.append(traj)
            except OSError:  # the sample is trained on all the same
                log.exception("cannot keep the trajectory in %s", self.dump.path)
        if not policy.tokens.prompt_ids:  # failed before the first generation
            messages = [dict(m) for m in _plain_list(kwargs.get("raw_prompt", []))]
            ids = await self.ct_build_initial_tokens(messages) if messages else []
            policy.tokens.prompt_ids = list(ids) or [self._pad_id()]
            policy.tokens.runtime_ids = list(policy.tokens.prompt_ids)
        drift = await self._drift_tokens(policy) if self.check_drift else None
        shape = None
        if self.routing_replay and policy.tokens.routed_experts is None:
            shape = await asyncio.get_running_loop().run_in_executor(
                None, _routing_shape, str(self.config.actor_rollout_ref.model.path)
            )
        output: AgentLoopOutput = to_agent_loop_output(
            traj,
            policy.tokens,
            response_length=self.response_length,
            logprobs=policy.want_logprobs,
            pad_token_id=self._pad_id(),
            masked_exits=self.masked_exits,
            fallback_global_steps=_last_global_steps or 0,
            routing_shape=shape,
            drift_tokens=drift,
        )
        return output

    async def _drift_tokens(self, policy: TokenPolicy) -> int | None:
        """Drifted tokens of the sample's buffer (``None`` when nothing was generated)."""
        if not policy.tokens.num_generations:
            return None
        kwargs = dict(self.apply_chat_template_kwargs or {})

        def measure() -> int:
            found = check_drift(
                self.tokenizer,
                policy.rendered_messages(),
                policy.tokens.runtime_ids,
                policy.tools,
                **kwargs,
            )
            return drifted_tokens(found)

        return await asyncio.get_running_loop().run_in_executor(_decoder(), measure)

    async def _episode(self, policy: TokenPolicy, kwargs: dict[str, Any]) -> Trajectory:
        loop = asyncio.get_running_loop()
        if isinstance(self._config, Exception):
            raise self._config
        config = self._config
        record = dict(kwargs)
        record.setdefault("agent_name", self.agent_name)
        if "prompt" not in record and "raw_prompt" in record:
            record["prompt"] = record["raw_prompt"]
        try:
            row = await loop.run_in_executor(None, TaskRow.from_record, record)
        except ValidationError as exc:
            return _failed(kwargs, f"not a sandlot row: {exc}")
        model = str(self.config.actor_rollout_ref.model.get("path", ""))
        n = int(self.rollout_config.get("n", 1))
        if n <= 1:
            return await run_episode(row, policy, config, model_name_or_path=model)
        setups = worker_setups()
        backend = config.sandbox.resolved_backend()
        async with _in_batch(setups, row.instance.instance_id, backend):
            return await run_episode(
                row,
                policy,
                config,
                model_name_or_path=model,
                setups=setups,
                group_size=n,
            )

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.tokenizer, "eos_token_id", None)
        return int(pad or 0)


@functools.cache
def _routing_shape(model_path: str) -> tuple[int, int] | None:
    """``(layers, top_k)`` of the MoE model at ``model_path`` (its ``config.json``), for the
    zero routing of a sample the server never answered; ``None`` if it names neither."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    layers = getattr(config, "num_hidden_layers", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    return (int(layers), int(top_k)) if layers and top_k else None


def _failed(kwargs: Mapping[str, Any], error: str) -> Trajectory:
    extra = _plain(kwargs.get("extra_info")) or {}
    instance_id = str(extra.get("instance_id") or kwargs.get("index") or "unknown")
    return Trajectory(instance_id=instance_id, exit_reason=ExitReason.INFRA_ERROR, error=error)


def _copy(messages: list[Message]) -> list[Message]:
    return [dict(m) for m in messages]


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _plain_list(value: Any) -> list[Any]:
    plain = _plain(value)
    return list(plain) if plain is not None else []
