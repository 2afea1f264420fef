"""``ModalSandbox``: a sandbox on Modal (https://modal.com/docs/guide/sandbox).

Written against the ``modal`` SDK 1.6.4, read in its source (``modal/sandbox/``,
``container_process.py``, ``io_streams.py``, ``app.py``, ``image.py``, ``secret.py``) and the
reference at https://modal.com/docs/reference/modal.Sandbox. Calls used, all through their ``.aio``
async variants: ``App.lookup(name, create_if_missing=True)``, ``Image.from_registry(tag, secret=)``,
``Image.run_commands(cmd)``, ``Secret.from_name(name)``, ``Sandbox.create(*cmd, app=, name=,
tags=, image=, env=, timeout=, idle_timeout=, workdir=, cpu=, memory=, block_network=)``,
``Sandbox.exec(*argv, timeout=, env=, text=False)`` (stdout/stderr read concurrently, stdin
``write``/``write_eof``/``drain``, ``wait``), ``Sandbox.poll``, ``Sandbox.terminate``,
``Sandbox.from_name``, ``Sandbox.list(app_id=, tags=)``, ``get_tags`` and
``Sandbox.filesystem.read_bytes``/``write_bytes``. Snapshots (the guide:
https://modal.com/docs/guide/sandbox-snapshots): ``Sandbox.snapshot_filesystem(timeout, ttl=)``
makes an ``Image`` whose ``object_id`` (``im-...``) is the handle, ``Image.from_id`` (lazy, called
without ``.aio``: 1.6.4 deprecates that) names it to ``Sandbox.create``, and
``modal.experimental.image_delete`` removes it.

The SDK is imported when a sandbox starts; subclasses may override :meth:`ModalSandbox.sdk`
(the tests substitute a fake module there).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, ClassVar, Literal, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError, SandboxFileError, SandboxStartError
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.images import backend_image
from sandlot.sandboxes.labels import RUN_ID, sandbox_labels
from sandlot.sandboxes.modal.build_step import build_step
from sandlot.sandboxes.modal.network import public_cidrs
from sandlot.sandboxes.modal.options import ModalOptions
from sandlot.sandboxes.modal.sdk import check_credentials, is_modal_error, modal_sdk, translate
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.shared.streamed_exec import StreamedExec
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import RemoteSandbox

log = logging.getLogger("sandlot.sandboxes.modal")
T = TypeVar("T")

# Modal's own exec timeout, a backstop behind ours in case this process dies mid-command.
_BACKSTOP_MARGIN_S = 30
# Create failures no retry can fix (the image's or the account's, not the service's).
_PERMANENT_CREATE = ("AuthError", "NotFoundError", "InvalidError")
_PERMANENT_CREATE_WORDS = ("not found", "unknown", "denied", "unauthorized", "invalid", "no such")


class ModalSandbox(StreamedExec):
    """A Modal Sandbox kept alive by a small PID 1; commands run in it with ``Sandbox.exec``.

    Args:
        spec: ``image`` is a registry name (canonical SWE-bench names are mapped by
            :func:`sandlot.sandboxes.images.backend_image`); ``cpu`` (cores) and ``memory_mb``
            (MiB) are Modal's requests; ``timeout_s`` (seconds, rounded up) is the sandbox
            lifetime; ``environment``'s packages are an image build step
            (:func:`~sandlot.sandboxes.modal.build_step.build_step`: the build has the network,
            the sandbox only ``spec.network``); ``network=False`` sets ``block_network``,
            ``network="internet"`` an
            ``outbound_cidr_allowlist`` of the public IPv4 blocks
            (:func:`sandlot.sandboxes.modal.network.public_cidrs`); ``env`` and ``workdir`` go to
            the sandbox; ``labels`` plus the ``sandlot.*`` labels become Modal tags.
        options: :class:`ModalOptions`.

    Raises (from ``start``):
        BackendUnavailableError: ``modal`` not installed, or no credentials (names the
            variables).
        SandboxStartError: the image cannot be pulled (permanent) or Modal refused or timed out
            (``retryable``).
    """

    name: ClassVar[str] = "modal"
    Options: ClassVar[type[ModalOptions]] = ModalOptions
    network_modes: ClassVar[tuple[bool | str, ...]] = (False, True, "internet")
    options: ModalOptions
    supports_snapshot: ClassVar[bool] = True  # Sandbox.snapshot_filesystem, an Image
    snapshot_scope: ClassVar[Literal["node", "global"]] = "global"  # an image id, any node
    # Modal reports an exec that hit its own timeout with return code -1.
    platform_timeout_code: ClassVar[int | None] = -1
    # The whole argv may total 64 KiB (ARG_MAX_BYTES in modal/sandbox/_common.py), and the
    # exec wrapper takes ~1 KiB of it.
    argv_command_bytes: ClassVar[int | None] = 60 * 1024

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._sb: Any = None
        self._attempts = 0
        self._abandoned: str | None = None
        self._lifetime = max(1, math.ceil(self.spec.timeout_s))  # Modal takes whole seconds
        self._ends_at = 0.0

    @classmethod
    def sdk(cls) -> ModuleType:
        """The ``modal`` module every call goes through."""
        return modal_sdk()

    @property
    def _modal_name(self) -> str:
        # Unique per start attempt: Modal names are unique among an App's running sandboxes.
        return f"{self.id}-{self._attempts}"

    @property
    def backend_id(self) -> str | None:
        """Modal's id of the sandbox (``sb-...``) once created, else ``None``."""
        return None if self._sb is None else str(self._sb.object_id)

    # ----------------------------------------------------------------- sandlot gc

    @classmethod
    def _reaper_context(cls, options: ModalOptions) -> tuple[ModuleType, str]:
        """The SDK and the App the sandboxes were created in.

        Raises:
            BackendUnavailableError: ``modal`` missing or no credentials.
        """
        sdk = cls.sdk()
        check_credentials()
        return sdk, options.app_name

    @classmethod
    async def _list_labelled(
        cls, context: tuple[ModuleType, str], run_id: str | None
    ) -> list[RemoteSandbox]:
        """``Sandbox.list(app_id=, tags=)`` of the App (``App.lookup``: no App, no sandboxes):
        running sandboxes, tags matched server side, read with ``get_tags``."""
        modal, app_name = context
        try:
            app = await modal.App.lookup.aio(app_name)
        except modal.exception.NotFoundError:
            return []
        found = []
        async for sb in modal.Sandbox.list.aio(
            app_id=app.app_id, tags={RUN_ID: run_id} if run_id else None
        ):
            found.append(
                RemoteSandbox("modal", sb.object_id, await sb.get_tags.aio(), "running", sb)
            )
        return found

    @classmethod
    async def _kill_listed(cls, context: object, sandbox: RemoteSandbox) -> None:
        """``terminate`` (a no-op on Modal's side if it already finished)."""
        await sandbox.handle.terminate.aio()

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        modal = self.sdk()
        check_credentials()
        spec, opts = self.spec, self.options
        image_name = backend_image(spec.image, "modal", opts.image_overrides)
        if self.origin is not None:  # a fork: the snapshot's image, looked up at create
            image_name = str(self.origin.handle)
        try:
            app = await modal.App.lookup.aio(opts.app_name, create_if_missing=True)
            secret = opts.registry_secret
            if self.origin is not None:
                image = modal.Image.from_id(image_name)
            else:
                image = modal.Image.from_registry(
                    image_name, secret=modal.Secret.from_name(secret) if secret else None
                )
                recipe = spec.environment
                if recipe is not None and recipe.has_packages:
                    image = image.run_commands(build_step(recipe, spec.env))
        except Exception as exc:
            raise self._start_error(modal, f"preparing image {image_name!r}", exc) from exc
        self._attempts += 1
        kwargs: dict[str, Any] = {
            "app": app,
            "name": self._modal_name,
            "tags": sandbox_labels(self.id, spec.labels),
            "image": image,
            "env": dict(spec.env) or None,
            "timeout": self._lifetime,
            "idle_timeout": opts.idle_timeout_s,
            "workdir": spec.workdir,
            "cpu": spec.cpu,
            "memory": spec.memory_mb,
            "block_network": spec.network is False,
        }
        if spec.network == "internet":
            kwargs["outbound_cidr_allowlist"] = list(public_cidrs())
        # PID 1 exits on SIGTERM at once (a bare `sleep` would ignore it) and outlives the
        # lifetime Modal enforces.
        init = remote_shell.init_argv(self._lifetime + 60)
        # Shielded: a cancelled caller must still learn the id of a sandbox Modal created, so
        # close() can terminate it.
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(opts.create_timeout_s) as scope:
                try:
                    self._sb = await modal.Sandbox.create.aio(*init, **kwargs)
                except Exception as exc:
                    raise self._start_error(modal, f"creating from {image_name!r}", exc) from exc
            if scope.cancelled_caught:
                self._abandoned = self._modal_name  # it may exist: _close looks for it
                raise SandboxStartError(
                    f"Modal did not create sandbox {self.id} within create_timeout_s="
                    f"{opts.create_timeout_s:g} s",
                    retryable=True,
                )
        self._ends_at = time.monotonic() + self._lifetime
        # The STARTING slot is held until a command works.
        if await self._run_quiet(remote_shell.mkdir_argv(spec.workdir)) != 0:
            raise SandboxStartError(f"sandbox {self.id}: cannot create workdir {spec.workdir}")

    async def _install_environment(self, recipe: EnvironmentRecipe) -> None:
        """Nothing to run: the recipe's packages were built into the image (``_start``)."""

    def _start_error(self, modal: ModuleType, what: str, exc: Exception) -> SandboxStartError:
        """Retryable when :func:`translate` says the service's fault ("Image build failed,
        please try again" and build timeouts included), unless the image or account is."""
        err = translate(what, exc)
        permanent = type(exc).__name__ in _PERMANENT_CREATE or any(
            w in str(exc).lower() for w in _PERMANENT_CREATE_WORDS
        )
        return SandboxStartError(
            f"sandbox {self.id}: {err}", retryable=err.retryable and not permanent
        )

    async def _close(self) -> None:
        """``terminate`` (a sandbox whose create was abandoned is first looked up by name), cut
        at ``control_timeout_s``; ``close`` tries again, then reports what is left."""
        modal, limit = self.sdk(), self.options.control_timeout_s
        try:
            with anyio.fail_after(limit):
                if self._sb is None and self._abandoned is not None:
                    with contextlib.suppress(modal.exception.NotFoundError):  # never created
                        self._sb = await modal.Sandbox.from_name.aio(
                            self.options.app_name, self._abandoned
                        )
                    self._abandoned = None
                if self._sb is not None:
                    await self._sb.terminate.aio()
        except Exception as exc:  # whatever failed, another try may work
            detail = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError):
                detail = f"Modal did not answer within control_timeout_s={limit:g} s"
            raise SandboxError(f"sandbox {self.id}: terminate: {detail}", retryable=True) from exc
        self._sb = None

    async def _snapshot(self) -> str:
        """``Sandbox.snapshot_filesystem`` (the files, not the processes), cut at
        ``control_timeout_s`` on both sides (Modal's own ``timeout`` is the same, rounded up, so
        the service stops too); the image's id. Modal images carry no tags: ``sandlot gc`` cannot
        find one a crash left behind, Modal removes it after ``snapshot_ttl_s``.

        Raises:
            SandboxDeadError: the sandbox finished.
            SandboxError: Modal failed or did not answer (``retryable``).
        """
        ttl, sdk_timeout = self.options.snapshot_ttl_s, math.ceil(self.options.control_timeout_s)
        snap = functools.partial(self._sb.snapshot_filesystem.aio, sdk_timeout, ttl=ttl)
        return str((await self._call("snapshot_filesystem", snap, control=True)).object_id)

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None:
        """``modal.experimental.image_delete(handle)`` (experimental in 1.6.4: the stable form
        may move to ``Image``), cut at ``control_timeout_s``; an image gone already is fine.

        Raises:
            TimeoutError: Modal did not answer; a Modal error as raised (``Snapshot`` logs it).
        """
        modal, limit = cls.sdk(), ModalOptions.model_validate(options).control_timeout_s
        with anyio.fail_after(limit), contextlib.suppress(modal.exception.NotFoundError):
            await modal.experimental.image_delete.aio(handle)

    async def _probe(self) -> str | None:
        """Why the Modal sandbox cannot run commands (it finished), else ``None``."""
        if self._sb is None:
            return "was terminated"
        # A poll that fails or does not answer tells nothing.
        with anyio.move_on_after(self.options.control_timeout_s), contextlib.suppress(Exception):
            code = await self._sb.poll.aio()
            if code is not None:
                return f"Modal sandbox {self.backend_id} finished with exit code {code}"
        return None

    async def _call(
        self, what: str, fn: Callable[..., Awaitable[T]], *args: Any, control: bool = False
    ) -> T:
        """Await ``fn(*args)``, with ``control`` cut after ``options.control_timeout_s`` (the
        SDK's own calls wait as long as its transport does: 155 s measured) as a retryable
        ``SandboxError``. An SDK or transport error (see :func:`is_modal_error`) becomes
        ``SandboxFileError`` (Modal's ``SandboxFilesystemError``), ``SandboxDeadError`` when
        the sandbox has finished, else a ``SandboxError`` (retryable for transient faults)."""
        limit = self.options.control_timeout_s
        try:
            with anyio.move_on_after(limit if control else None):
                return await fn(*args)
            raise SandboxError(
                f"sandbox {self.id}: {what}: Modal did not answer within "
                f"control_timeout_s={limit:g} s",
                retryable=True,
            )
        except SandboxError:
            raise
        except Exception as exc:
            modal = self.sdk()
            if not is_modal_error(modal, exc):
                raise
            if isinstance(exc, modal.exception.SandboxFilesystemError):
                raise SandboxFileError(f"{what}: {exc}") from exc
            raise await self._gone() or translate(f"sandbox {self.id}: {what}", exc) from exc

    # ----------------------------------------------------------------- commands

    async def _spawn(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Any:
        """``Sandbox.exec``; Modal's own exec timeout is set 30 s after ``timeout`` (plus
        ``stop_grace_s``), a backstop behind ours in case this process dies mid-command."""
        backstop = None
        if timeout is not None:
            backstop = math.ceil(timeout + self.options.stop_grace_s) + _BACKSTOP_MARGIN_S
        proc = await self._sb.exec.aio(*argv, timeout=backstop, env=env or None, text=False)
        return _ModalProcess(proc)

    # ----------------------------------------------------------------- files

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """``Sandbox.filesystem.read_bytes`` (whole: Modal's API has no ranged read)."""
        read = self._sb.filesystem.read_bytes.aio
        return bytes(await self._call(f"read_file {path}", read, path, control=True))

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """``Sandbox.filesystem.write_bytes``, which creates the parents."""
        write = self._sb.filesystem.write_bytes.aio
        await self._call(f"write_file {path}", write, data, path, control=True)


class _ModalProcess:
    """A ``ContainerProcess`` as a :class:`~sandlot.sandboxes.shared.streamed_exec.Process`."""

    def __init__(self, proc: Any) -> None:
        self._proc, self.stdout, self.stderr = proc, proc.stdout, proc.stderr

    async def send(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        await self._proc.stdin.drain.aio()

    async def send_eof(self) -> None:
        self._proc.stdin.write_eof()
        await self._proc.stdin.drain.aio()

    async def wait(self) -> int:
        return int(await self._proc.wait.aio())

    def close(self) -> None:
        """Nothing to drop: the SDK ends the streams itself."""
