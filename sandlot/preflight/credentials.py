"""The backend check: its SDK, credentials and control plane, each looked at once.

* ``modal``: a token (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or a profile,
  :func:`sandlot.sandboxes.modal.sdk.check_credentials`), then one TCP connection to the
  control plane ``modal.config`` names (``server_url``, ``MODAL_SERVER_URL``) within
  :data:`CONNECT_TIMEOUT_S`: an unreachable one otherwise costs minutes per sandbox.
* ``vefaas``: the access and secret keys (:func:`sandlot.sandboxes.vefaas.config.credentials`).
* ``kubernetes``: its client, and a kubeconfig (``kubeconfig`` option, ``$KUBECONFIG``,
  ``~/.kube/config``) or the service account of the pod this runs in.
* ``docker``: the engine answers a ping within :data:`CONNECT_TIMEOUT_S`.
* ``local``: nothing (the images check covers skopeo).

Credentials are reported by the variables that hold them, never by value.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from sandlot.errors import SandlotError
from sandlot.preflight.problem import Problem

CONNECT_TIMEOUT_S = 5.0
"""Seconds a control plane or engine has to accept a connection or answer a ping."""


def backend_problems(backend: str, options: Any) -> list[Problem]:
    """The problems of ``backend`` with ``options`` (its ``Options`` model) on this machine.

    Args:
        backend: a registered backend name.
        options: the backend's options (``base_url`` of docker, keys of veFaaS, ...).
    """
    subject = f"backend {backend}"
    try:
        if backend == "modal":
            return _modal(subject)
        if backend == "vefaas":
            from sandlot.sandboxes.vefaas.config import credentials

            credentials(options)
        elif backend == "kubernetes":
            return _kubernetes(subject, options)
        elif backend == "docker":
            return _docker(subject, getattr(options, "base_url", None))
    except SandlotError as exc:  # BackendUnavailableError: no SDK, no credentials
        return [Problem(subject, str(exc))]
    return []


def _kubernetes(subject: str, options: Any) -> list[Problem]:
    import os

    from sandlot.sandboxes.kubernetes.client import k8s, kubeconfig_path, no_cluster

    k8s()
    path = kubeconfig_path(options)
    if os.path.isfile(path.split(os.pathsep)[0]) or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return []
    return [Problem(subject, no_cluster(path))]


def _modal(subject: str) -> list[Problem]:
    from sandlot.sandboxes.modal.sdk import check_credentials, modal_sdk

    check_credentials()
    server = str(modal_sdk().config.config.get("server_url"))
    parts = urlsplit(server)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return [
            Problem(
                subject,
                f"the Modal control plane {server} is unreachable ({exc.strerror or exc})",
                "check the network (a proxy or firewall) and MODAL_SERVER_URL",
            )
        ]
    return []


def _docker(subject: str, base_url: str | None) -> list[Problem]:
    from sandlot.sandboxes.docker.engine import sdk, unreachable

    docker = sdk()
    try:
        if base_url is None:
            client = docker.from_env(timeout=CONNECT_TIMEOUT_S)
        else:
            client = docker.DockerClient(base_url=base_url, timeout=CONNECT_TIMEOUT_S)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the SDK's DockerException, requests' and socket errors
        return [Problem(subject, str(unreachable(base_url, exc)))]
    return []
