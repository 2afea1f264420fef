"""Bring an instance's environment up in a fresh sandbox: spec, repository, setup command."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import anyio

from sandlot.datasets.instance import Instance
from sandlot.rewards.scripts import EVAL_DIR, fetch_repo_script
from sandlot.sandboxes.base import Sandbox, output_tail
from sandlot.sandboxes.errors import SandboxSetupError
from sandlot.sandboxes.spec import SandboxSpec

_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
_SETUP_TIMEOUT_S = 1800.0
_UPLOADED_REPO = f"{EVAL_DIR}/repo-source"


def is_url(source: str) -> bool:
    """``True`` for git URLs (``https://...``, ``ssh://...``, ``git@host:...``)."""
    return bool(_URL.match(source))


def instance_spec(instance: Instance, backend: str) -> SandboxSpec:
    """The ``SandboxSpec`` that evaluates ``instance`` on ``backend``.

    The network is on only when the repository must be cloned from a URL. On the ``local``
    backend with the host image, the interpreter running sandlot comes first on ``PATH`` so
    that ``python`` in a test command means the Python that has the test tools installed.
    """
    env = dict(instance.env)
    if backend == "local" and instance.image == "host" and "PATH" not in env:
        host_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), host_path])
    return SandboxSpec(
        image=instance.image,
        workdir=instance.workdir,
        env=env,
        network=bool(instance.repo_source and is_url(instance.repo_source)),
        labels={"sandlot.instance_id": instance.instance_id},
    )


async def prepare_repo(sb: Sandbox, instance: Instance) -> None:
    """Put the repository at ``base_commit`` into ``workdir`` and run ``post_setup_cmd``.

    A host path in ``repo_source`` is uploaded and cloned inside the sandbox; a URL is cloned
    inside the sandbox; without ``repo_source`` the image must already hold the repository.

    Raises:
        FileNotFoundError: ``repo_source`` is a host path that does not exist.
        SandboxSetupError: cloning or ``post_setup_cmd`` failed (carries the output tail).
    """
    source = instance.repo_source
    if source:
        if is_url(source):
            script = fetch_repo_script(
                source, instance.workdir, instance.base_commit, uploaded=False
            )
        else:
            if not await anyio.Path(source).exists():
                raise FileNotFoundError(
                    f"repo_source {source} of instance {instance.instance_id} does not exist "
                    "on this machine (for examples/swe-mini run examples/swe-mini/make_repos.py)"
                )
            await sb.upload(source, _UPLOADED_REPO)
            script = fetch_repo_script(
                _UPLOADED_REPO, instance.workdir, instance.base_commit, uploaded=True
            )
        await _run_setup(sb, script, instance, label=f"fetch repo from {source}")
    if instance.post_setup_cmd:
        await _run_setup(sb, instance.post_setup_cmd, instance, label=None)


async def _run_setup(sb: Sandbox, script: str, instance: Instance, *, label: str | None) -> None:
    r = await sb.exec(script, timeout=_SETUP_TIMEOUT_S, cwd=instance.workdir if not label else "/")
    if not r.ok:
        tail = output_tail(r.stdout + r.stderr)
        raise SandboxSetupError(label or script, r.exit_code, tail)
