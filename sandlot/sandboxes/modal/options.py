"""``ModalOptions``: settings of the ``modal`` backend that ``SandboxSpec`` does not cover."""

from __future__ import annotations

from pydantic import Field

from sandlot.sandboxes.transport import ExecOptions


class ModalOptions(ExecOptions):
    """Options of the ``modal`` backend, with :class:`~sandlot.sandboxes.transport.ExecOptions`'s
    (``max_output_bytes``, ``stop_grace_s``).

    Attributes:
        app_name: Modal App the sandboxes belong to (looked up, created if missing).
        registry_secret: name of a Modal Secret holding ``REGISTRY_USERNAME`` /
            ``REGISTRY_PASSWORD`` for a private registry, or ``None`` for public images.
        idle_timeout_s: seconds without exec or I/O after which Modal ends the sandbox, or
            ``None`` (only ``spec.timeout_s`` applies).
        image_overrides: canonical image name → Modal registry name, consulted before the
            built-in table (see :mod:`sandlot.sandboxes.images`).
        create_timeout_s: seconds one ``Sandbox.create`` call may take before the attempt is
            abandoned (and the sandbox, if it appears, terminated by name).
        control_timeout_s: seconds one control call (``poll``, ``terminate``,
            ``filesystem.read_bytes``/``write_bytes``) may take; the SDK itself waits as long as
            its transport does (155 s measured against an unresponsive API). A terminate cut
            off is retried by ``close`` within its budget, a poll cut off says nothing. A
            ``snapshot_filesystem`` too (and Modal's own timeout of it): raise it for large
            filesystems.
        snapshot_ttl_s: seconds Modal keeps a snapshot image (``snapshot_filesystem``'s
            ``ttl``), or ``None`` for ever; ``snap.delete()`` removes it sooner, this removes
            what a crashed run left (``sandlot gc`` cannot list Modal images).
    """

    app_name: str = "sandlot"
    registry_secret: str | None = None
    idle_timeout_s: int | None = Field(default=None, gt=0)
    image_overrides: dict[str, str] = Field(default_factory=dict)
    create_timeout_s: float = Field(default=300.0, gt=0)
    control_timeout_s: float = Field(default=20.0, gt=0)
    snapshot_ttl_s: int | None = Field(default=30 * 24 * 3600, gt=0)  # the SDK's default
