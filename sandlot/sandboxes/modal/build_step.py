"""An environment recipe as one Modal image build step, which has the network.

``Image.run_commands(*commands)`` (modal 1.6.4, ``modal/_image.py``) writes each command as a
Dockerfile ``RUN`` line, built by Modal's image builder with the network and cached by content:
the sandboxes of a recipe share one build, and the sandbox itself can be created with
``block_network``. A ``RUN`` line is one line, so the recipe's script
(:meth:`~sandlot.sandboxes.environment.EnvironmentRecipe.container_script`, several lines with
a here-document) travels base64-encoded and is decoded by ``base64`` (coreutils) in the image.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping

from sandlot.sandboxes.environment import EnvironmentRecipe


def build_step(recipe: EnvironmentRecipe, env: Mapping[str, str]) -> str:
    """The one-line shell command that builds ``recipe``'s environment in an image build.

    Args:
        recipe: the environment recipe (its packages; repository steps are not part of it).
        env: the sandbox's environment variables (e.g. ``PIP_INDEX_URL``); they apply to the
            build as to the install on the other backends, except ``PATH``: the build runs
            on the image's own.

    Returns:
        ``printf %s <base64> | base64 -d | env K=V ... sh``.
    """
    script = base64.b64encode(recipe.container_script().encode()).decode()
    assignments = [shlex.quote(f"{k}={v}") for k, v in sorted(env.items()) if k != "PATH"]
    return f"printf %s {script} | base64 -d | env {' '.join([*assignments, 'sh'])}"
