"""``DockerOptions``: settings of the ``docker`` backend that ``SandboxSpec`` does not cover."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from sandlot.sandboxes.transport import ExecOptions

MiB = 1024 * 1024


class RegistryAuth(BaseModel):
    """Credentials for pulling ``spec.image`` from a private registry.

    Attributes:
        username: registry user name.
        password: password or access token (kept out of reprs and logs).
        server: registry address (e.g. ``"ghcr.io"``); ``None`` lets the engine infer it from the
            image name.
    """

    model_config = ConfigDict(extra="forbid")

    username: str
    password: SecretStr
    server: str | None = None


class DockerOptions(ExecOptions):
    """Options of the ``docker`` backend (Docker Engine, or Podman's Docker-compatible API),
    with :class:`~sandlot.sandboxes.transport.ExecOptions`'s (``max_output_bytes``,
    ``stop_grace_s``).

    Attributes:
        base_url: engine address, e.g. ``"unix:///var/run/docker.sock"`` or
            ``"tcp://host:2375"``. ``None`` reads ``DOCKER_HOST`` (and ``DOCKER_TLS_VERIFY`` /
            ``DOCKER_CERT_PATH``) like ``docker.from_env()``; ``ssh://`` is not supported.
        pull: image pull policy. ``"missing"`` pulls only when the engine lacks ``spec.image``,
            ``"always"`` pulls before every start, ``"never"`` fails when the image is absent.
        registry_auth: credentials for pulls from a private registry, or ``None``.
        pids_limit: cap on the number of processes in the container (fork-bomb guard); always
            set, since an engine's default may be no limit at all (Docker).
    """

    base_url: str | None = None
    pull: Literal["missing", "always", "never"] = "missing"
    registry_auth: RegistryAuth | None = None
    pids_limit: int = Field(default=4096, gt=0)
