"""``sandlot train --preflight``: on the head node, what the first hour on a cluster finds out.

After the dry run's checks (:mod:`sandlot.trainer.startup`), three questions the config cannot
answer:

* **the Ray cluster**: enough alive nodes with ``--ngpus-per-node`` GPUs each for the mode's
  layout (``async``/``v1``: ``nnodes_train`` trainer + ``nnodes_rollout`` rollout nodes;
  ``sync``: all of them colocated);
* **the backend's credentials**: the configured backend's own check (Modal's token variables
  or profile, veFaaS's access keys), reported by variable name, never by value;
* **the trainer's logger**: verl's default ``trainer.logger`` includes ``wandb``, whose
  ``wandb.init`` fails without a key when the trainer starts (no terminal to ask on);
* **one sandbox**: the first training row's sandbox starts on the configured backend, runs
  ``true`` and is closed, timed.

Each finding is a :class:`~sandlot.trainer.startup.Problem` naming what to fix.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio

from sandlot.rollout.agent import episode_spec
from sandlot.rollout.config import AgentConfig
from sandlot.rollout.rows import load_rows
from sandlot.sandboxes.open import open as open_sandbox
from sandlot.trainer.startup import Problem

SANDBOX_START_BUDGET_S = 600.0
"""How long the one sandbox may take to start and run ``true`` (an image pull included)."""


def gpu_bundles(cfg: Any, mode: str) -> list[int]:
    """The GPUs verl's resource pools ask Ray for, one entry per node-sized bundle: the
    trainer's ``trainer.nnodes`` x ``trainer.n_gpus_per_node``, and for ``async``/``v1`` the
    standalone rollout pool's ``nnodes`` x ``n_gpus_per_node``."""
    bundles = [int(cfg.trainer.n_gpus_per_node)] * int(cfg.trainer.nnodes)
    if mode != "sync":
        rollout = cfg.actor_rollout_ref.rollout
        bundles += [int(rollout.n_gpus_per_node)] * int(rollout.nnodes)
    return sorted(bundles, reverse=True)


def cluster_problems(nodes: Iterable[Mapping[str, Any]], bundles: list[int]) -> list[Problem]:
    """Whether ``bundles`` (:func:`gpu_bundles`) fit on ``nodes`` (``ray.nodes()`` entries:
    ``Alive``, ``Resources`` with ``GPU``), each bundle on one node (first fit, largest first).
    """
    free = sorted(
        (int(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive")), reverse=True
    )
    gpus = list(free)
    unplaced = []
    for size in sorted(bundles, reverse=True):
        slot = next((i for i, left in enumerate(free) if left >= size), None)
        if slot is None:
            unplaced.append(size)
        else:
            free[slot] -= size
    if not unplaced:
        return []
    return [
        Problem(
            "ray cluster",
            f"the run asks for node bundles of {bundles} GPUs; the cluster's alive nodes have "
            f"{gpus or 'no'} GPUs, and bundles of {unplaced} do not fit",
            "start Ray on more GPU nodes (`ray start --address=<head>:6379`) or lower "
            "--nnodes-train/--nnodes-rollout/--ngpus-per-node",
        )
    ]


def ray_nodes(address: str = "auto") -> list[dict[str, Any]]:
    """``ray.nodes()`` of the running cluster at ``address``.

    Raises:
        ConnectionError: no Ray cluster there (Ray's own error, re-raised with the fix).
    """
    import ray

    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except ConnectionError as exc:
        raise ConnectionError(f"{exc}; start it with `ray start --head` on this node") from None
    try:
        return list(ray.nodes())
    finally:
        ray.shutdown()


def credential_problems(config: AgentConfig) -> list[Problem]:
    """The configured backend's own credentials check (names only, never values)."""
    backend = config.sandbox.resolved_backend()
    options = config.sandbox.options_for(backend)
    try:
        if backend == "modal":
            from sandlot.sandboxes.modal.sdk import check_credentials

            check_credentials()
        elif backend == "vefaas":
            from sandlot.sandboxes.vefaas.config import credentials

            credentials(options)  # type: ignore[arg-type]
    except Exception as exc:
        return [
            Problem(
                f"backend {backend} credentials",
                str(exc),
                "export them on every node before `ray start` (examples/train/runtime_env.yaml "
                "forwards them by name)",
            )
        ]
    return []


def logger_problems(cfg: Any) -> list[Problem]:
    """``wandb`` in ``trainer.logger`` needs ``WANDB_API_KEY``, a ``wandb login`` (``~/.netrc``)
    or ``WANDB_MODE=offline``/``disabled`` on the head node (names only)."""
    loggers = cfg.trainer.get("logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "wandb" not in loggers:
        return []
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return []
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        if "api.wandb.ai" in netrc.read_text(encoding="utf-8"):
            return []
    except OSError:
        pass
    return [
        Problem(
            "trainer.logger",
            f"{loggers} includes wandb, and neither WANDB_API_KEY nor a `wandb login` is set: "
            "the trainer would fail when it starts",
            "export WANDB_API_KEY (or run `wandb login`), or pass trainer.logger='[console]'",
        )
    ]


async def sandbox_problems(config: AgentConfig, train_file: Path) -> tuple[list[Problem], float]:
    """Start the first row's sandbox of ``train_file`` on the configured backend, run ``true``,
    close it; a failure or a non-zero exit is a problem.

    Returns:
        The problems (none or one) and the seconds from open to closed.
    """
    backend = config.sandbox.resolved_backend()
    key = f"backend {backend} sandbox"
    try:
        rows = load_rows(train_file, backend=backend)
        if not rows:
            return [Problem(str(train_file), "has no rows", "prepare the training set again")], 0.0
        spec = episode_spec(rows[0], config, backend)
        started = time.monotonic()
        with anyio.fail_after(SANDBOX_START_BUDGET_S):
            async with open_sandbox(
                backend, spec, options=config.sandbox.options_for(backend)
            ) as sb:
                result = await sb.exec("true", timeout=60)
    except Exception as exc:
        problem = Problem(
            key,
            f"{type(exc).__name__}: {exc}",
            "fix the backend (docs/cloud-backends.md) before training: every sample would be "
            "masked",
        )
        return [problem], 0.0
    seconds = time.monotonic() - started
    if result.exit_code != 0:
        said = f"`true` exited {result.exit_code}: {result.stderr[-500:]}"
        return [Problem(key, said, "check the image")], seconds
    return [], seconds
