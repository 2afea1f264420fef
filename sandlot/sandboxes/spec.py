"""``SandboxSpec``: one description of a sandbox, understood by every backend."""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.scale.starting import StartLimits


class SandboxSpec(BaseModel):
    """What to open. Unknown keys are rejected, so a typo in a config never goes unnoticed.

    Attributes:
        image: what the sandbox runs on. For ``local``: ``"host"`` (the host's root, read-only)
            or a path to a root filesystem directory; for container backends an image name.
        post_setup_cmd: a shell command run once by ``start()``, after the environment;
            failure aborts the start.
        post_setup_timeout_s: time limit of ``post_setup_cmd`` in seconds.
        env: environment variables set for every command.
        workdir: absolute path of the private writable working directory (the default cwd).
        cpu: CPU limit in cores, or ``None``. ``local``: a CFS quota on the sandbox's cpu
            cgroup when the host gives us a writable one (otherwise not enforced: a warning is
            logged once per process).
        memory_mb: memory limit in MiB, or ``None`` for the backend default.
        disk_mb: disk budget in MiB for everything the sandbox writes, or ``None`` for none.
            ``local``: a size-limited tmpfs holding the sandbox's writable directories (needs
            root or CAP_SYS_ADMIN on the host; its pages count as memory). ``docker``: the
            container's writable layer (``storage_opt size``); an engine whose storage driver
            cannot enforce it refuses the start with a ``SandboxStartError``.
        timeout_s: lifetime of the sandbox in seconds; backends that support it kill it after.
        network: ``False`` (default; model-written code is hostile): no network at all.
            ``True``: whatever the backend's network reaches, which may include the host
            (``local``: the host's own ``127.0.0.1`` services; ``docker``: the host through the
            bridge gateway). ``"internet"``: outbound only, no host and no private address
            ranges; backends that cannot enforce it refuse to start rather than allow more.
        labels: free-form labels attached to remote resources (used by ``sandlot gc``).
        environment: the test environment (interpreter, packages, install steps) the backend
            provides before ``post_setup_cmd``; see :mod:`sandlot.sandboxes.environment`.
        start_limits: this sandbox's start attempts, backoff and budget; ``None`` reads the
            ``SANDLOT_START_*`` environment variables. The STARTING caps are process-wide
            settings, not fields here (see :mod:`sandlot.sandboxes.scale.starting`).
    """

    model_config = ConfigDict(extra="forbid")

    image: str = "host"
    post_setup_cmd: str | None = None
    post_setup_timeout_s: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/testbed"
    cpu: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    disk_mb: int | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=3600.0, gt=0)
    network: bool | Literal["internet"] = False
    labels: dict[str, str] = Field(default_factory=dict)
    environment: EnvironmentRecipe | None = None
    start_limits: StartLimits | None = None


def image_workdir(spec: SandboxSpec, working_dir: str) -> str | None:
    """The workdir a sandbox of an image whose config says ``WorkingDir: working_dir`` gets
    from it: that directory (relative to ``/``, normalised) when ``spec`` leaves ``workdir``
    unset, as ``docker run`` without ``-w``; ``None`` keeps ``spec.workdir``: a ``workdir``
    given wins (as ``-w``), and an image without ``WorkingDir``, or with ``/`` (a workdir is
    a private directory of its own), keeps the default."""
    if not working_dir or "workdir" in spec.model_fields_set:
        return None
    wanted = posixpath.normpath(posixpath.join("/", working_dir))
    return None if wanted in ("/", "//", spec.workdir) else wanted
