"""``VefaasOptions``: settings of the ``vefaas`` backend that ``SandboxSpec`` does not cover."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from sandlot.sandboxes.shared.swerex_plane import SwerexPlaneOptions


class VefaasOptions(SwerexPlaneOptions):
    """Options of the ``vefaas`` backend, with those of its data plane
    (:class:`~sandlot.sandboxes.shared.swerex_plane.SwerexPlaneOptions`: ``max_output_bytes``,
    ``stop_grace_s``, ``request_retries``, ``server_restart_s``, ``port`` (the
    ``InstanceImageInfo.Port``), ``bootstrap``, ``ready_timeout_s``, ``swerex_python``,
    ``swerex_find_links``).

    Attributes:
        access_key, secret_key, session_token, region, function_id, function_route: the
            Volcengine credentials (``session_token`` of temporary STS ones, sent signed as
            ``X-Security-Token``), the region (default ``cn-beijing``), and the sandbox
            application's function id(s) and HTTP route(s), comma separated and paired by
            position; each ``None`` reads its variable (``VOLCE_*``, ``VEFAAS_*``, see
            :mod:`sandlot.settings`).
        endpoint: control-plane host (``open.volcengineapi.com`` style), or ``None`` for the
            SDK's default; with ``scheme`` it points the SDK at another server.
        scheme: ``https`` or ``http`` for ``endpoint``.
        image_overrides: canonical image name → veFaaS registry name (see
            :mod:`sandlot.sandboxes.images`).
        proxy: HTTP(S) proxy URL for the control plane, or ``None``.
        control_timeout_s: connect and read timeout in seconds of each control-plane call.
        create_settle_s: seconds after a ``CreateSandbox`` went unanswered during which its
            instance may still appear (the service may act on a create after the client gave
            up on it). The instances carrying the sandbox's labels are looked for this long
            before the start is tried again; one that appears later is left to ``sandlot gc``.
    """

    access_key: SecretStr | None = None
    secret_key: SecretStr | None = None
    session_token: SecretStr | None = None
    region: str | None = None
    function_id: str | None = None
    function_route: str | None = None
    endpoint: str | None = None
    scheme: Literal["https", "http"] = "https"
    image_overrides: dict[str, str] = Field(default_factory=dict)
    proxy: str | None = None
    control_timeout_s: float = Field(default=60.0, gt=0)
    create_settle_s: float = Field(default=30.0, ge=0)
