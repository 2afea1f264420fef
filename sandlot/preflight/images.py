"""The images check: every distinct image the run names is usable, resolved once.

Per distinct image (never per instance; in parallel, :data:`WORKERS` at a time):

* a container backend (``docker``, ``modal``, ``vefaas``) and ``host``: refused (``host`` is
  this machine's root, which only ``local`` runs);
* ``local``: a root filesystem directory exists; a local source (``oci:DIR``, an archive)
  exists; a registry name is in the image cache, else its registry answers for it
  (:func:`sandlot.images.remote.check_remote`: one manifest request);
* ``docker``: the engine has the image, else (``pull="never"`` refuses) the registry answers
  for it: the engine's distribution endpoint, or where the engine has none (Podman) skopeo
  on this machine when installed.

``modal`` and ``vefaas`` pull on their side, with their credentials: nothing to ask from here.
Docker Hub counts manifest requests against its pull limit: a run of many uncached Docker Hub
images spends one request per image here (``--no-preflight`` skips it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from sandlot.errors import BackendUnavailableError, SandlotError
from sandlot.images.pulling import name_key
from sandlot.images.reference import parse
from sandlot.images.remote import check_remote
from sandlot.images.store import ImageStore
from sandlot.preflight.problem import Problem
from sandlot.sandboxes.registry import get_backend

WORKERS = 8
"""Images resolved at once."""

REGISTRY_TIMEOUT_S = 30.0
"""Seconds the engine may take to answer for one image (a registry request included)."""

Resolve = Callable[[str], str | None]
"""Looks at one image: why it is not usable (one line with the fix), or ``None``."""


def image_problems(images: Iterable[str], backend: str, options: Any) -> list[Problem]:
    """The problems of the images ``images`` names (one entry per instance) on ``backend``.

    Args:
        images: each instance's image for ``backend`` (repeats are looked at once).
        backend: a registered backend name.
        options: the backend's options (docker's ``base_url``, ``pull``, ``registry_auth``).
    """
    counts = Counter(images)
    problems = []
    if not get_backend(backend).on_host and "host" in counts:
        problems.append(
            Problem(
                "image host",
                f"{counts.pop('host')} instance(s) run in 'host' (this machine's root), which "
                f"only the local backend runs",
                f"pass --image REF, or give the rows an image for {backend} (an image map "
                f'such as {{"local": "host", "{backend}": "python:3.12"}})',
            )
        )
    names = list(counts)
    try:
        with ExitStack() as cleanup:
            resolve = resolver(backend, options, cleanup)
            if resolve is None:
                return problems
            with ThreadPoolExecutor(max_workers=WORKERS) as pool:
                verdicts = list(pool.map(resolve, names))
    except SandlotError as exc:  # a missing tool (skopeo) or SDK: once, not per image
        return [*problems, Problem(f"backend {backend}", str(exc))]
    for name, why in zip(names, verdicts, strict=True):
        if why is not None:
            problems.append(Problem(f"image {name} ({counts[name]} instance(s))", why))
    return problems


def resolver(backend: str, options: Any, cleanup: ExitStack) -> Resolve | None:
    """How images are looked at for ``backend``; ``None`` where nothing is asked from here.
    What it opens (an engine client) is closed by ``cleanup``. The returned function raises
    :class:`~sandlot.errors.BackendUnavailableError` when a tool it needs (skopeo) is missing.

    Raises:
        SandlotError: the backend's SDK is missing (the message names the extra).
    """
    if get_backend(backend).on_host:
        return _local_resolver()
    if backend == "docker":
        return _docker_resolver(options, cleanup)
    return None


def _local_resolver() -> Resolve:
    store = ImageStore()

    def resolve(image: str) -> str | None:
        if image == "host":
            return None
        try:
            ref = parse(image)
        except ValueError as exc:
            return f"{exc}"
        if ref is None:
            if Path(image).expanduser().is_dir():
                return None
            return (
                f"the root filesystem directory {image} does not exist; create it or fix the name"
            )
        if store.resolve(name_key(ref)) is not None:
            return None
        if ref.local:
            body = ref.source.split(":", 1)[1]
            if any(Path(c).exists() for c in (body, body.rsplit(":", 1)[0])):
                return None
            return f"{body} does not exist; build or export the image there, or fix the name"
        try:
            check_remote(ref)
        except BackendUnavailableError:
            raise
        except SandlotError as exc:
            return str(exc)
        return None

    return resolve


def _docker_resolver(options: Any, cleanup: ExitStack) -> Resolve:
    from sandlot.sandboxes.docker.engine import sdk

    docker = sdk()
    base_url = getattr(options, "base_url", None)
    policy = getattr(options, "pull", "missing")
    auth = getattr(options, "registry_auth", None)
    auth_config = None
    if auth is not None:
        auth_config = {"username": auth.username, "password": auth.password.get_secret_value()}
        auth_config |= {"serveraddress": auth.server} if auth.server else {}
    if base_url is None:
        client = docker.from_env(timeout=REGISTRY_TIMEOUT_S)
    else:
        client = docker.DockerClient(base_url=base_url, timeout=REGISTRY_TIMEOUT_S)
    cleanup.callback(client.close)

    def resolve(image: str) -> str | None:
        try:
            client.images.get(image)
            return None
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.DockerException as exc:
            return f"the engine could not look it up: {exc}"
        if policy == "never":
            return (
                "the engine does not have it and pull='never'; build or load it there "
                "(docker build/load, podman load) or use pull='missing'"
            )
        try:
            client.api.inspect_distribution(image, auth_config=auth_config)
            return None
        except docker.errors.NotFound as exc:
            if exc.explanation not in (None, "Not Found"):
                return f"not present in the engine and not pullable: {exc.explanation}"
        except docker.errors.APIError as exc:
            return f"not present in the engine and not pullable: {exc.explanation or exc}"
        except docker.errors.DockerException as exc:
            return f"the engine could not look it up: {exc}"
        return _docker_fallback(image, auth)

    return resolve


def _docker_fallback(image: str, auth: Any) -> str | None:
    """An engine without the distribution endpoint (Podman answers a bare 404): ask the
    registry with skopeo when it is installed, else trust the pull at the first start."""
    try:
        ref = parse(image)
    except ValueError as exc:
        return str(exc)
    if ref is None or ref.local:
        return None
    creds = f"{auth.username}:{auth.password.get_secret_value()}" if auth else None
    try:
        check_remote(ref, creds=creds)
    except BackendUnavailableError:
        return None
    except SandlotError as exc:
        return str(exc)
    return None
