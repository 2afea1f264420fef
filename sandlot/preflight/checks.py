"""All the checks of one run, in order, each problem once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.datasets.instance import Instance
from sandlot.preflight.credentials import backend_problems
from sandlot.preflight.endpoint import endpoint_problems
from sandlot.preflight.images import image_problems
from sandlot.preflight.output import output_problems
from sandlot.preflight.problem import Problem
from sandlot.sandboxes.registry import get_backend


@dataclass(frozen=True)
class Endpoint:
    """The model server a run asks (``sandlot rollout``'s ``--base-url``).

    Attributes:
        base_url: OpenAI-compatible base URL, ending with ``/v1``.
        api_key: the key, or ``None`` (never printed).
        api_key_env: the variable the key comes from, for the fix.
    """

    base_url: str
    api_key: str | None
    api_key_env: str = "OPENAI_API_KEY"


def run_problems(
    *,
    instances: Sequence[Instance],
    backend: str,
    options: Any = None,
    output: tuple[str, Path] | None = None,
    endpoint: Endpoint | None = None,
) -> list[Problem]:
    """Every problem known before the run starts (none: go).

    Args:
        instances: the instances the run will process (after every selection).
        backend: the resolved backend name.
        options: the backend's options; ``None``: its defaults.
        output: ``(flag, directory)`` the run writes into, when it writes one.
        endpoint: the model server, when the run asks one.
    """
    if options is None:
        options = get_backend(backend).Options()
    problems: list[Problem] = []  # an empty dataset is refused by the commands as they load it
    if output is not None:
        problems += output_problems(output[1], output[0])
    found = backend_problems(backend, options)
    problems += found
    images, unmapped = _images(instances, backend)
    problems += unmapped
    if not found:  # an engine that does not answer would fail every image again
        problems += image_problems(images, backend, options)
    if endpoint is not None:
        problems += endpoint_problems(
            endpoint.base_url, api_key=endpoint.api_key, api_key_env=endpoint.api_key_env
        )
    return problems


def _images(instances: Sequence[Instance], backend: str) -> tuple[list[str], list[Problem]]:
    """Each instance's image on ``backend``, and one problem for those whose image map has
    no entry for it."""
    images, unmapped = [], []
    for instance in instances:
        try:
            images.append(instance.image_for(backend))
        except ValueError:
            unmapped.append(instance.instance_id)
    if not unmapped:
        return images, []
    shown = ", ".join(unmapped[:5]) + (" ..." if len(unmapped) > 5 else "")
    problem = Problem(
        "--dataset",
        f"{len(unmapped)} instance(s) ({shown}) map images for other backends but not {backend}",
        f"pass --image, or add a {backend!r} (or 'default') entry to their image map",
    )
    return images, [problem]
