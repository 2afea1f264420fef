"""``VefaasSandbox``: a sandbox on Volcengine veFaaS, driven through a SWE-ReX server.

Control plane: the veFaaS service package of the Volcengine SDK (``volcenginesdk-vefaas``
5.0.54, see :mod:`sandlot.sandboxes.vefaas.control`). Data plane: the instance runs a SWE-ReX
server (swe-rex 1.4.0, started by :mod:`sandlot.sandboxes.shared.swerex_bootstrap`), reached at the
function's HTTP route with the header ``x-faas-instance-name: <sandbox id>`` and the server's
``X-API-Key`` (:mod:`sandlot.sandboxes.shared.swerex_plane`: polled jobs, ``/upload``, ``base64``
over ``/execute``). Sources: the veFaaS sandbox API docs
(https://www.volcengine.com/docs/6662/1806654), vefaas-dev/code-examples ``sandbox-cookbook``,
and verl-project/uni-agent ``uni_agent/sandbox/vefaas.py`` (instance header, bootstrap ``exec``).
"""

from __future__ import annotations

import logging
import secrets
from typing import ClassVar

from pydantic import BaseModel

from sandlot.errors import SandboxError, SandboxStartError
from sandlot.runtimes.swerex import SwerexClient
from sandlot.sandboxes.images import backend_image
from sandlot.sandboxes.labels import OWNER, RUN_ID, SANDBOX_ID, sandbox_labels
from sandlot.sandboxes.shared.swerex_plane import SwerexPlane
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import RemoteSandbox
from sandlot.sandboxes.vefaas.config import FunctionTarget, credentials, function_ids, pick_target
from sandlot.sandboxes.vefaas.control import (
    GONE,
    RUNNING,
    ControlPlane,
    ControlPlaneError,
)
from sandlot.sandboxes.vefaas.options import VefaasOptions

log = logging.getLogger("sandlot.sandboxes.vefaas")

INSTANCE_HEADER = "x-faas-instance-name"
# Labels that make a listed instance this sandbox's: checked on every row, whatever the
# service's filter did.
_OWN_LABELS = (SANDBOX_ID, RUN_ID, OWNER)
# How long a lost create is looked for after create_settle_s while listings fail (close's
# budget, 60 s, must hold it and the kill).
_LOOK_MORE_S = 20.0


class VefaasSandbox(SwerexPlane):
    """One veFaaS sandbox instance of a sandbox application (function).

    Args:
        spec: ``image`` (canonical SWE-bench names are mapped to the veFaaS mirrors by
            :func:`sandlot.sandboxes.images.backend_image`); ``timeout_s`` is the lifetime
            (``Timeout`` in seconds); ``cpu`` cores become ``CpuMilli``; ``memory_mb`` is
            ``MemoryMB``; ``env`` becomes ``Envs``; ``labels`` plus the ``sandlot.*`` labels
            become ``Metadata``. ``network`` is not enforced: egress is a property of the veFaaS
            function's network configuration (a warning is logged when ``network=False``).
        options: :class:`VefaasOptions`.

    Raises (from ``start``):
        BackendUnavailableError: SDK missing, credentials or function targets missing (the
            message names the variables).
        SandboxStartError: ``CreateSandbox`` refused (``retryable`` for rate limits and
            capacity), the instance failed before its server answered (``retryable`` unless
            veFaaS gives an error code naming a permanent cause, such as a start command that
            exits), or the SWE-ReX server never answered within ``ready_timeout_s``.
    """

    name: ClassVar[str] = "vefaas"
    Options: ClassVar[type[VefaasOptions]] = VefaasOptions
    options: VefaasOptions

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._control: ControlPlane | None = None
        self._target: FunctionTarget | None = None
        self._sandbox_id: str | None = None
        self._labels: dict[str, str] = {}
        # A CreateSandbox whose answer was lost may have created an instance we know no id of.
        self._unanswered_create = False

    @property
    def sandbox_id(self) -> str | None:
        """veFaaS's id of the instance once created, else ``None``."""
        return self._sandbox_id

    backend_id = sandbox_id  # the id leak reports and `sandlot gc --leaked` match

    # ----------------------------------------------------------------- sandlot gc

    @classmethod
    def _reaper_context(cls, options: VefaasOptions) -> tuple[ControlPlane, list[str]]:
        """The control plane and every function id of ``VEFAAS_FUNCTION_ID`` / the
        ``function_id`` option (no route is needed).

        Raises:
            BackendUnavailableError: SDK, credentials or function ids missing.
        """
        functions = sorted(set(function_ids(options)))
        return ControlPlane(credentials(options), options), functions

    @classmethod
    async def _list_labelled(
        cls, context: tuple[ControlPlane, list[str]], run_id: str | None
    ) -> list[RemoteSandbox]:
        """``ListSandboxes`` of every function, filtered by ``Metadata`` when ``run_id`` is
        given (every page up to the reported total), less those on their way out."""
        control, found = context[0], []
        for function_id in context[1]:
            rows = await control.list(function_id, {RUN_ID: run_id} if run_id else None)
            found += [
                RemoteSandbox("vefaas", row.id, row.metadata, row.status, (control, function_id))
                for row in rows
                if row.status not in GONE
            ]
        return found

    @classmethod
    async def _kill_listed(cls, context: object, sandbox: RemoteSandbox) -> None:
        """``KillSandbox``; one that expired since the listing counts as killed (404).

        Raises:
            SandboxError: the control plane refused or could not be reached.
        """
        control, function_id = sandbox.handle
        await control.kill(function_id, sandbox.id)

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        spec, opts = self.spec, self.options
        if self._control is None:
            self._control = ControlPlane(credentials(opts), opts)
        self._target = target = pick_target(opts)
        if not spec.network:
            log.debug("vefaas: network=False is not enforced; egress follows the function's config")
        token = secrets.token_urlsafe(24)
        self._labels = sandbox_labels(self.id, spec.labels)
        image = backend_image(spec.image, "vefaas", opts.image_overrides)
        request = self._control.create_request(
            spec.model_copy(update={"image": image, "labels": self._labels}),
            function_id=target.function_id,
            command=self._server_command(spec.workdir, token),
            port=opts.port,
        )
        try:
            await self._control.create(request, self._record)
        except SandboxStartError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ControlPlaneError) and cause.ambiguous):
                raise
            self._unanswered_create = True  # if cancelled meanwhile, _close looks for it
            lost = await self._find_lost_create(self.options.create_settle_s, _LOOK_MORE_S)
            if lost is None:
                raise  # it never took effect: the next attempt creates again
            log.info("sandbox %s: adopting %s of an unanswered create", self.id, lost)
            self._sandbox_id, self._unanswered_create = lost, False
        assert self._sandbox_id is not None
        self._client = SwerexClient(
            target.route,
            api_key=token,
            headers={INSTANCE_HEADER: self._sandbox_id},
            retries=opts.request_retries,
        )
        await self._wait_server(self._failed)

    def _record(self, sandbox_id: str) -> None:
        self._sandbox_id = sandbox_id

    async def _failed(self) -> None:
        """Raise ``SandboxStartError`` when ``DescribeSandbox`` says the instance failed; a
        describe that fails (throttled, unreachable, not yet known) tells nothing."""
        assert self._control is not None and self._target is not None
        try:
            info = await self._control.describe(self._target.function_id, self._id)
        except ControlPlaneError as exc:
            log.debug("sandbox %s: DescribeSandbox while waiting: %s", self.id, exc)
            return
        if info.status not in ("", "Creating", "Pending", RUNNING):
            raise SandboxStartError(
                f"sandbox {self.id}: veFaaS instance {self._id} is {info.status}"
                + (f" ({info.error_code})" if info.error_code else "")
                + (f": {info.error}" if info.error else ""),
                retryable=info.failure_retryable,
            )

    @property
    def _id(self) -> str:
        assert self._sandbox_id is not None, "sandbox not created"
        return self._sandbox_id

    async def _close(self) -> None:
        """Close the data-plane client, then ``KillSandbox`` (``close`` tries again: it is what
        stops the bill). After a create whose answer was lost (cancelled while it was looked
        for), the instance it may have made is looked for (:meth:`_find_lost_create`) and
        killed instead."""
        await self._close_client()
        if self._control is None or self._target is None:
            return
        if self._sandbox_id is not None:
            await self._kill(self._sandbox_id)
            self._sandbox_id = None
        elif self._unanswered_create:
            lost = await self._find_lost_create(self.options.create_settle_s, _LOOK_MORE_S)
            if lost is not None:
                await self._kill(lost)
        self._unanswered_create = False

    async def _kill(self, sandbox_id: str) -> None:
        """``KillSandbox`` once.

        Raises:
            SandboxError: it failed (``retryable`` as the control plane said; the message names
                the instance and how ``sandlot gc`` removes it).
        """
        assert self._control is not None and self._target is not None
        try:
            await self._control.kill(self._target.function_id, sandbox_id)
        except SandboxError as exc:
            raise SandboxError(
                f"sandbox {self.id}: KillSandbox {sandbox_id} failed: {exc}; "
                "`sandlot gc --backend vefaas --run-id <run id>` removes it",
                retryable=exc.retryable,
            ) from exc

    async def _find_created(self) -> str | None:
        """``ListSandboxes`` filtered by the ``sandlot.sandbox_id`` label; the live instance
        whose own labels (``sandlot.sandbox_id``, ``sandlot.run_id``, ``sandlot.owner``) are
        this sandbox's, checked on every row whatever the server's filter did."""
        assert self._control is not None and self._target is not None
        rows = await self._control.list(self._target.function_id, {SANDBOX_ID: self.id})
        own = {k: self._labels.get(k) for k in _OWN_LABELS}
        for row in rows:
            if row.status not in GONE and all(row.metadata.get(k) == v for k, v in own.items()):
                return row.id
        return None

    async def _probe(self) -> str | None:
        """Why the instance cannot run commands, else ``None``: the control plane first (not
        ``Running``, unknown), then, unless it found the instance dead, the SWE-ReX server
        (:meth:`_server_gone`)."""
        if self._control is None or self._target is None or self._sandbox_id is None:
            return "veFaaS instance is gone"
        try:
            info = await self._control.describe(self._target.function_id, self._sandbox_id)
        except ControlPlaneError as exc:
            if exc.not_found:
                return f"veFaaS instance {self._sandbox_id} is unknown to veFaaS ({exc})"
        except Exception as exc:  # an SDK fault not classified: cannot tell
            log.warning("sandbox %s: liveness unknown: %s", self.id, exc)
        else:
            if info.status != RUNNING:
                return f"veFaaS instance {self._sandbox_id} is {info.status or 'gone'}"
        return await self._server_gone()
