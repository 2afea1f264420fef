"""``VefaasOptions``: settings of the ``vefaas`` backend that ``SandboxSpec`` does not cover."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from sandlot.sandboxes.swerex_plane import SwerexPlaneOptions


class VefaasOptions(SwerexPlaneOptions):
    """Options of the ``vefaas`` backend, with those of its data plane
    (:class:`~sandlot.sandboxes.swerex_plane.SwerexPlaneOptions`: ``max_output_bytes``,
    ``stop_grace_s``, ``request_retries``, ``server_restart_s``). Unset credentials and targets
    come from the environment (see :mod:`sandlot.sandboxes.vefaas.config`).

    Attributes:
        access_key: Volcengine access key; ``None`` reads ``VOLCE_ACCESS_KEY`` /
            ``VOLCENGINE_ACCESS_KEY``.
        secret_key: Volcengine secret key; ``None`` reads ``VOLCE_SECRET_KEY`` /
            ``VOLCENGINE_SECRET_KEY``.
        session_token: the session token of temporary (STS) credentials, sent signed as
            ``X-Security-Token``; ``None`` reads ``VOLCE_SESSION_TOKEN`` /
            ``VOLCENGINE_SESSION_TOKEN`` (unset: long-term keys).
        region: region; ``None`` reads ``VEFAAS_REGION``, default ``cn-beijing``.
        function_id: the sandbox application's function id(s), comma separated; ``None`` reads
            ``VEFAAS_FUNCTION_ID``.
        function_route: the function's HTTP route(s), comma separated and paired by position
            with ``function_id``; ``None`` reads ``VEFAAS_FUNCTION_ROUTE``.
        endpoint: control-plane host (``open.volcengineapi.com`` style), or ``None`` for the
            SDK's default; with ``scheme`` it points the SDK at another server.
        scheme: ``https`` or ``http`` for ``endpoint``.
        port: port of the SWE-ReX server in the instance (``InstanceImageInfo.Port``).
        bootstrap: the instance's start command, a template with ``{workdir}``, ``{port}`` and
            ``{token}``; it must end by ``exec``-ing a SWE-ReX server (PID 1). ``None`` uses
            :data:`sandlot.sandboxes.vefaas.bootstrap.DEFAULT_BOOTSTRAP`.
        ready_timeout_s: seconds to wait for the SWE-ReX server to answer after creation.
        image_overrides: canonical image name → veFaaS registry name (see
            :mod:`sandlot.sandboxes.images`).
        proxy: HTTP(S) proxy URL for the control plane, or ``None``.
        control_timeout_s: connect and read timeout in seconds of each control-plane call.
        create_settle_s: seconds after a ``CreateSandbox`` went unanswered during which its
            instance may still appear (the service may act on a create after the client gave
            up on it). The instances carrying the sandbox's labels are looked for this long
            before the start is tried again; one that appears later is left to ``sandlot gc``.
        swerex_python: path, inside the instance, of a Python interpreter that already has
            ``swe-rex`` (pre-staged in the image or on a mounted volume); the default bootstrap
            then starts the server with it and installs nothing. ``None``: the image's
            ``swerex-remote`` / ``python3``.
        swerex_find_links: a directory in the instance or an ``http(s)`` URL holding the wheels
            of ``swe-rex`` and its dependencies (``pip download swe-rex==1.4.0 -d DIR``); when
            the image lacks swe-rex the bootstrap installs from there with ``--no-index``, so
            the function needs no PyPI egress. ``None``: install from PyPI.
    """

    access_key: SecretStr | None = None
    secret_key: SecretStr | None = None
    session_token: SecretStr | None = None
    region: str | None = None
    function_id: str | None = None
    function_route: str | None = None
    endpoint: str | None = None
    scheme: Literal["https", "http"] = "https"
    port: int = Field(default=8000, gt=0, lt=65536)
    bootstrap: str | None = None
    ready_timeout_s: float = Field(default=300.0, gt=0)
    image_overrides: dict[str, str] = Field(default_factory=dict)
    proxy: str | None = None
    control_timeout_s: float = Field(default=60.0, gt=0)
    create_settle_s: float = Field(default=30.0, ge=0)
    swerex_python: str | None = None
    swerex_find_links: str | None = None
