"""``DockerSandbox``: a sandbox in a container of a Docker Engine or of Podman's Docker API.

Written against the ``docker`` SDK 7.1 low-level ``APIClient``
(https://docker-py.readthedocs.io/en/7.1.0/api.html) and the Docker Engine API v1.41
(https://docs.docker.com/engine/api/v1.41/), the version Podman 4 serves. The SDK is imported
only when a sandbox starts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import posixpath
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, ClassVar, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import (
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxStartError,
)
from sandlot.sandboxes.archive import file_archive, read_single_file
from sandlot.sandboxes.docker.commit import commit, force_remove, list_snapshots, remove
from sandlot.sandboxes.docker.engine import (
    api_error,
    describe_address,
    get_client,
    is_connection_error,
    run_blocking,
    sdk,
    unreachable,
)
from sandlot.sandboxes.docker.options import DockerOptions, MiB
from sandlot.sandboxes.docker.proc import read_only_proc
from sandlot.sandboxes.docker.setup_network import disconnect_all
from sandlot.sandboxes.docker.stream import AttachedProcess
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.labels import RUN_ID, sandbox_labels
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.shared.streamed_exec import Process, StreamedExec
from sandlot.sandboxes.spec import SandboxSpec, image_workdir
from sandlot.sandboxes.transport import Reader, RemoteSandbox, TreeCaps

if TYPE_CHECKING:
    from docker import APIClient

log = logging.getLogger("sandlot.sandboxes.docker")
T = TypeVar("T")

# A path that is a symlink to a symlink ... is followed this many times by read_file/download.
_MAX_LINK_HOPS = 8
# Go's os.ModeSymlink, in the "mode" of the engine's path stat.
_MODE_SYMLINK = 1 << 27
# Beyond the SIGTERM grace, how long the in-container killer may take before we give up.
_KILL_BUDGET_S = 15.0
# How Docker and Podman refuse storage_opt size on a driver that cannot enforce it ("--storage-opt
# is supported only for overlay over xfs with 'pquota' mount option", "... does not support
# storage options", quota errors).
_DISK_QUOTA_ERRORS = ("storage-opt", "storage opt", "storage option", "quota")
# Pull errors that another attempt cannot fix.
_PERMANENT_PULL_ERRORS = ("not found", "unknown", "unauthorized", "denied", "no such", "invalid")


class DockerSandbox(StreamedExec):
    """A container kept alive by a small PID 1; commands run in it with ``docker exec``.

    Args:
        spec: ``image`` is an image name the engine knows (or can pull, see ``pull``);
            ``workdir`` is created by the engine (left unset, the image's ``WorkingDir`` when
            it has one, as ``docker run`` without ``-w``); ``cpu`` (cores) becomes ``NanoCpus``,
            ``memory_mb`` (MiB) the memory limit with swap disabled; ``network=False`` gives
            ``network_mode="none"`` (with an environment recipe to install: the engine's
            default network, disconnected once the install is done,
            :mod:`sandlot.sandboxes.docker.setup_network`); ``timeout_s`` (seconds) is the
            container's lifetime: PID 1 exits after it and the engine kills everything else.
        options: :class:`DockerOptions`.

    Every container carries the labels ``sandlot.run_id``, ``sandlot.created_at`` (unix
    seconds), ``sandlot.owner`` (``user@host``), ``sandlot.sandbox_id`` and ``spec.labels``.

    Raises (from ``start``):
        EngineUnreachableError: nothing answers at ``base_url`` / ``DOCKER_HOST``.
        BackendUnavailableError: the ``docker`` SDK is not installed.
        SandboxStartError: image absent with ``pull="never"``, pull failed, engine refused.
    """

    name: ClassVar[str] = "docker"
    enforces_disk_mb: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True  # a committed image (docker/commit.py)
    Options: ClassVar[type[DockerOptions]] = DockerOptions
    options: DockerOptions
    status_in_band: ClassVar[bool] = True  # Podman forgets an ended exec (docs/docker.md)
    sweep_orphans: ClassVar[bool] = True  # PID 1 is sandlot's init (remote_shell.init_argv)
    # Killer rounds: a command whose exec was still starting when one round scanned /proc is
    # found only by a later one.
    kill_attempts: ClassVar[int] = 3

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._api: APIClient | None = None
        self._container_id: str | None = None

    @property
    def _online_install(self) -> bool:
        """Whether the container gets a network for its environment install only (a spec
        without network whose recipe installs packages; a fork's image holds them)."""
        recipe = self.spec.environment
        return bool(
            not self.spec.network
            and self.origin is None
            and recipe is not None
            and recipe.has_packages
        )

    @property
    def container_id(self) -> str | None:
        """Id of the container once created, else ``None``."""
        return self._container_id

    backend_id = container_id  # the id leak reports and `sandlot gc --leaked` match

    # ----------------------------------------------------------------- sandlot gc

    @classmethod
    def _reaper_context(cls, options: DockerOptions) -> APIClient:
        """The engine's client.

        Raises:
            BackendUnavailableError: the ``docker`` SDK is not installed.
            EngineUnreachableError: the engine does not answer.
        """
        return get_client(options.base_url).api

    @classmethod
    async def _list_labelled(cls, context: APIClient, run_id: str | None) -> list[RemoteSandbox]:
        """Containers (running or not) labelled ``sandlot.run_id`` (= ``run_id`` if given),
        then snapshot images (state ``"snapshot"``)."""
        label = f"{RUN_ID}={run_id}" if run_id else RUN_ID
        rows = await run_blocking(lambda: context.containers(all=True, filters={"label": label}))
        images = await run_blocking(list_snapshots, context, run_id)
        return [
            RemoteSandbox("docker", row["Id"], row.get("Labels") or {}, row.get("State", ""))
            for row in rows
        ] + [RemoteSandbox("docker", i["Id"], i.get("Labels") or {}, "snapshot") for i in images]

    @classmethod
    async def _kill_listed(cls, context: APIClient, sandbox: RemoteSandbox) -> None:
        """Force-remove the container and its anonymous volumes, or the snapshot image (and the
        containers using it); gone already is fine."""
        remover = force_remove if sandbox.state == "snapshot" else _remove_container
        await run_blocking(remover, context, sandbox.id)

    # ----------------------------------------------------------------- engine calls

    @property
    def _client(self) -> APIClient:
        assert self._api is not None, "sandbox not started"
        return self._api

    @property
    def _cid(self) -> str:
        assert self._container_id is not None, "sandbox not started"
        return self._container_id

    async def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, path: str | None = None
    ) -> Any:
        """Run a blocking engine call in a worker thread (or await ``fn`` when it is async);
        map its failure to ``SandboxDeadError`` when the container is gone, to a
        ``SandboxFileError`` naming ``path`` (if given) when the engine refused, else to
        ``SandboxError`` (retryable for connection errors and 5xx)."""
        try:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args)
            return await run_blocking(fn, *args)
        except SandboxError:
            raise
        except Exception as exc:
            errors = sdk().errors
            if isinstance(exc, errors.APIError):
                if dead := await self._gone():
                    raise dead from exc
                if path is not None:
                    missing = isinstance(exc, errors.NotFound)
                    detail = "no such file or directory" if missing else exc.explanation
                    raise SandboxFileError(f"{what} {path}: {detail}") from exc
            raise api_error(what, exc, self.options.base_url) from exc

    async def _probe(self) -> str | None:
        """Why the container cannot run commands (removed, not running), else ``None``."""
        try:
            info = await run_blocking(self._client.inspect_container, self._cid)
        except sdk().errors.NotFound:
            return f"container {self._cid[:12]} was removed"
        except Exception:
            return None  # cannot tell; the caller reports its own error
        state = info.get("State") or {}
        if state.get("Running"):
            return None
        reason = f"container {self._cid[:12]} is not running (exit code {state.get('ExitCode')}"
        if state.get("OOMKilled"):
            reason += ", killed for exceeding memory_mb"
        if time.monotonic() >= self._ends_at:
            reason += f", lifetime timeout_s={self.spec.timeout_s:g} s reached"
        return reason + ")"

    async def _running(self) -> None:
        """Raise ``SandboxDeadError`` unless the container runs: the archive endpoints also work
        on a stopped one."""
        if dead := await self._gone():
            raise dead

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        # Also called again after `_close` when a start attempt is retried.
        self._container_id = None
        client = await run_blocking(get_client, self.options.base_url)
        self._api = client.api
        try:
            await run_blocking(self._create_and_start)
        except SandboxError:
            raise
        except Exception as exc:
            if is_connection_error(exc):
                raise unreachable(self.options.base_url, exc) from exc
            err = api_error(f"starting a container from {self.spec.image!r}", exc, None)
            raise SandboxStartError(str(err), retryable=err.retryable) from exc
        self._ends_at = time.monotonic() + self.spec.timeout_s

    def _create_and_start(self) -> None:
        if self.origin is not None:
            self._create_fork()
        else:
            self._create_pulling()
        self._client.start(self._container_id)

    def _create_fork(self) -> None:
        """Create a container of the snapshot's image, which is local: never pulled (a pull
        would fetch the set-up's base image, ``spec.image``, and still find no snapshot)."""
        assert self.origin is not None and self.origin.handle is not None
        try:
            self._create()
        except sdk().errors.ImageNotFound as exc:
            raise SandboxStartError(
                f"snapshot image {self.origin.handle[:19]} is no longer in the engine at "
                f"{describe_address(self.options.base_url)} (removed by `sandlot gc`, "
                "`docker image rm` or `prune`); take a new snapshot",
                retryable=False,
            ) from exc

    def _create_pulling(self) -> None:
        """Create a container of ``spec.image``, pulled as ``options.pull`` says."""
        if self.options.pull == "always":
            self._pull()
        try:
            self._create()
        except sdk().errors.ImageNotFound as exc:
            if self.options.pull == "never":
                raise SandboxStartError(
                    f"image {self.spec.image!r} is not in the engine at "
                    f"{describe_address(self.options.base_url)} and pull='never'; build or load "
                    "it there (docker build/load, podman import) or use pull='missing'",
                    retryable=False,
                ) from exc
            self._pull()
            self._create()

    def _adopt_working_dir(self) -> None:
        """Make the image's ``WorkingDir`` the workdir when the spec leaves it unset
        (:func:`~sandlot.sandboxes.spec.image_workdir`, as ``local`` does): one inspect of the
        image, only then (a fork's workdir is its snapshot's).

        Raises:
            docker.errors.ImageNotFound: the image is not in the engine (pulled, then retried).
        """
        if self.origin is not None or "workdir" in self.spec.model_fields_set:
            return
        config = self._client.inspect_image(self.spec.image).get("Config") or {}
        wanted = image_workdir(self.spec, config.get("WorkingDir") or "")
        if wanted is not None:
            self.spec = self.spec.model_copy(update={"workdir": wanted})

    def _create(self) -> None:
        self._adopt_working_dir()
        spec, opts, api = self.spec, self.options, self._client
        memory = spec.memory_mb * MiB if spec.memory_mb else None
        host_config = api.create_host_config(
            network_mode=None if spec.network or self._online_install else "none",
            mem_limit=memory,
            memswap_limit=memory,  # equal to mem_limit: no swap on top of the limit
            nano_cpus=int(spec.cpu * 1e9) if spec.cpu else None,
            pids_limit=opts.pids_limit,
            storage_opt={"size": f"{spec.disk_mb}m"} if spec.disk_mb else None,
        )
        host_config.update(read_only_proc(api))  # fields the SDK has no keyword for (proc.py)
        try:
            created = api.create_container(
                self.origin.handle if self.origin else spec.image,
                entrypoint=remote_shell.init_argv(spec.timeout_s),
                name=self.id,
                labels=sandbox_labels(self.id, spec.labels),
                environment=spec.env,
                working_dir=spec.workdir,
                host_config=host_config,
                detach=True,
            )
        except sdk().errors.APIError as exc:
            if spec.disk_mb and any(
                e in str(exc.explanation or exc).lower() for e in _DISK_QUOTA_ERRORS
            ):
                raise SandboxStartError(
                    f"disk_mb={spec.disk_mb} needs a storage driver that enforces a size per "
                    "container (Docker: overlay2 on xfs mounted with pquota, btrfs, zfs, "
                    "devicemapper; Podman: overlay on xfs with pquota), and the engine at "
                    f"{describe_address(opts.base_url)} said: {exc.explanation}; "
                    "use disk_mb=None there",
                    retryable=False,
                ) from exc
            raise
        # Recorded here, in the worker thread: a cancelled start still removes the container.
        self._container_id = created["Id"]

    def _pull(self) -> None:
        image, policy = self.spec.image, self.options.pull
        auth, auth_config = self.options.registry_auth, None
        if auth is not None:
            auth_config = {"username": auth.username, "password": auth.password.get_secret_value()}
            auth_config |= {"serveraddress": auth.server} if auth.server else {}
        try:
            events = self._client.pull(image, stream=True, decode=True, auth_config=auth_config)
            for event in events:
                if "error" in event:
                    message = str(event["error"])
                    permanent = any(word in message.lower() for word in _PERMANENT_PULL_ERRORS)
                    raise SandboxStartError(
                        f"pulling image {image!r} (pull={policy!r}) failed: {message}",
                        retryable=not permanent,
                    )
        except sdk().errors.APIError as exc:
            raise SandboxStartError(
                f"pulling image {image!r} (pull={policy!r}) failed: {exc.explanation or exc}",
                retryable=exc.status_code is None or exc.status_code >= 500,
            ) from exc

    async def _install_environment(self, recipe: EnvironmentRecipe) -> None:
        """The recipe's container script, run on the engine's default network; then every
        network is disconnected when the spec has none (a failed install leaves the container
        to ``start``, which removes it).

        Raises:
            SandboxSetupError: the script failed.
            SandboxError: the network could not be taken away.
        """
        await super()._install_environment(recipe)
        if self._online_install:
            await self._call(
                "disconnecting the environment install's network",
                disconnect_all,
                self._client,
                self._cid,
            )

    async def _snapshot(self) -> str:
        return await self._call("committing", commit, self._client, self._cid, self.spec.labels)

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None:
        await remove(handle, getattr(options, "base_url", None))

    async def _close(self) -> None:
        if self._api is not None and self._container_id is not None:
            await run_blocking(_remove_container, self._api, self._container_id)

    # ----------------------------------------------------------------- commands

    async def _spawn(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Process:
        """``exec_create(stdin=True)`` + ``exec_start(socket=True)``: the hijacked connection
        (:mod:`sandlot.sandboxes.docker.stream`); the exit status comes in band (see
        ``status_in_band``). ``timeout``: the engine has no backstop of its own; PID 1 ends
        every process at the sandbox's lifetime."""

        def start() -> Process:
            api = self._client
            exec_id = str(api.exec_create(self._cid, argv, stdin=True, environment=env)["Id"])
            status = functools.partial(self._inspect_exec, exec_id)
            return AttachedProcess(api.exec_start(exec_id, socket=True), status)

        return await run_blocking(start)

    async def _inspect_exec(self, exec_id: str) -> dict[str, Any]:
        """``exec_inspect``; ``{}`` once the engine forgot the exec (Podman,
        ``exit_command_delay = 0``)."""

        def inspect() -> dict[str, Any]:
            try:
                return dict(self._client.exec_inspect(exec_id))
            except sdk().errors.NotFound:
                return {}

        return await self._call("exec inspect", inspect)

    async def _exec_running(self, proc: Process) -> bool:
        assert isinstance(proc, AttachedProcess)
        return await proc.running()

    async def _stuck(self, marker: str, proc: Process) -> None:
        """The in-container killer (shell builtins only, see
        :mod:`sandlot.sandboxes.shared.remote_shell`) could not run or left survivors (no process
        slot left, ``/bin/sh`` deleted): the engine sends SIGUSR1 to PID 1, which kills every other
        process of the container; if even that fails the engine kills the container and the
        sandbox is dead (the next call says why)."""
        log.warning("sandbox %s: emptying the container to stop exec %s", self.id, marker)
        with anyio.move_on_after(_KILL_BUDGET_S):
            try:
                await self._call("reset", self._client.kill, self._cid, "SIGUSR1")
                for _ in range(50):
                    await anyio.sleep(0.1)
                    if not await self._exec_running(proc):
                        return
            except SandboxDeadError:
                return
            except SandboxError as exc:
                log.warning("sandbox %s: reset failed: %s", self.id, exc)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_BUDGET_S):
            try:
                await run_blocking(self._client.kill, self._cid)
            except Exception as exc:
                log.warning("sandbox %s: killing container failed: %s", self.id, exc)
        self._mark_dead(
            f"container {self._cid[:12]} was killed: a timed-out command could not be stopped "
            "inside it"
        )

    # ----------------------------------------------------------------- files

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """The file's bytes: the engine's archive of it, its size checked from the tar header
        before its content is read."""
        return await self._fetch(
            "read_file", path, lambda raw: read_single_file(raw, path, max_bytes)
        )

    async def _get_archive(self, path: str, caps: TreeCaps, consume: Reader[T]) -> T:
        """The engine's archive of ``path``, streamed into ``consume`` (never stored whole);
        ``consume`` enforces the caps from the tar headers."""
        return await self._fetch("download", path, consume)

    async def _fetch(self, what: str, path: str, consume: Reader[T]) -> T:
        """``consume`` called on the engine's tar stream of ``path``, a link at ``path`` followed
        (read as it arrives, never stored whole; the connection is dropped after).

        ``GET /containers/{id}/archive`` (Engine API v1.41) answers with the base64 JSON
        ``X-Docker-Container-Path-Stat`` of the path itself (a link's ``mode`` has Go's
        ``ModeSymlink`` bit; its ``linkTarget`` is where it leads) on Docker and Podman alike: a
        link's archive is dropped unread and its target's asked for.
        """
        await self._running()
        api = self._client

        def fetch(path: str) -> T:
            for _ in range(_MAX_LINK_HOPS):
                url = api._url("/containers/{0}/archive", self._cid)
                response = api._get(url, params={"path": path}, stream=True)
                try:
                    api._raise_for_status(response)
                    header = response.headers["X-Docker-Container-Path-Stat"]
                    stat = sdk().utils.decode_json_header(header)
                    target = stat.get("linkTarget") or ""
                    if not int(stat.get("mode") or 0) & _MODE_SYMLINK or target in ("", path):
                        return consume(response.raw)
                finally:
                    response.close()
                path = posixpath.join(posixpath.dirname(path), target)
            raise SandboxFileError(f"{what}: too many levels of symbolic links: {path}")

        return await self._call(what, fetch, path, path=path)

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """A one-file archive through the engine (mode 0644, owner root)."""
        parent, name = posixpath.split(path)
        await self._put("write_file", path, parent, io.BytesIO(file_archive(name, data)))

    async def _put_archive(self, parent: str, archive: IO[bytes], target: str) -> None:
        """``PUT /containers/{id}/archive``, streamed from ``archive`` (owners become root)."""
        await self._put("upload", target, parent, archive)

    async def _put(self, what: str, target: str, parent: str, archive: IO[bytes]) -> None:
        """Unpack ``archive`` into the container directory ``parent``, which may be missing."""
        await self._running()

        def put() -> bool:
            try:
                put_archive(self._client, self._cid, parent, archive)
                return True
            except sdk().errors.NotFound:
                return False  # Podman creates a missing destination directory, Docker answers 404.

        if not await self._call(what, put, path=target):
            await self._run_quiet(remote_shell.mkdir_argv(parent))
            archive.seek(0)
            await self._call(
                what, put_archive, self._client, self._cid, parent, archive, path=target
            )


def _remove_container(api: APIClient, container: str) -> None:
    """Force-remove ``container`` and its anonymous volumes; removed already is fine."""
    with contextlib.suppress(sdk().errors.NotFound):
        api.remove_container(container, force=True, v=True)


def put_archive(api: APIClient, container: str, path: str, data: IO[bytes]) -> None:
    """``APIClient.put_archive`` with ``noOverwriteDirNonDir=true``, which the SDK lacks.

    Without it Docker and Podman silently replace a directory by a file and vice versa.
    Docker Engine API v1.41, ``PUT /containers/{id}/archive``.
    """
    url = api._url("/containers/{0}/archive", container)
    response = api._put(url, params={"path": path, "noOverwriteDirNonDir": "true"}, data=data)
    api._raise_for_status(response)
