"""What an ``image=`` string of the ``local`` backend names.

* ``"host"``: the host's own system (unchanged);
* a root filesystem directory: an absolute or ``./``-relative path, or any existing directory
  (unchanged);
* a local source skopeo reads: ``oci:DIR[:TAG]``, ``oci-archive:FILE[:TAG]``,
  ``docker-archive:FILE[:REF]``, or an explicit ``docker://REF``;
* anything else that parses as a docker reference (``python:3.12``,
  ``swebench/sweb.eval.x86_64.django_1776_django-11099:latest``,
  ``registry.example:5000/x@sha256:<hex>``): pulled from its registry, Docker Hub when the
  first component names no host (docker's rule: it contains ``.`` or ``:`` or is
  ``localhost``).

The reference grammar is the one of ``distribution/reference`` (``reference.go``), which docker
and skopeo parse with.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

LOCAL_TRANSPORTS = ("oci:", "oci-archive:", "docker-archive:")
"""skopeo transports of local sources (``containers-transports(5)``)."""

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


@dataclass(frozen=True)
class Reference:
    """A pullable image name.

    Attributes:
        text: the name as given.
        source: the skopeo source (``docker://...``, ``oci:...``, ...).
        registry: host[:port] of the registry, ``None`` for a local source.
        by_digest: the name pins a manifest digest (nothing to re-resolve).
    """

    text: str
    source: str
    registry: str | None
    by_digest: bool

    @property
    def local(self) -> bool:
        """A local source (a directory or archive), not a registry."""
        return self.registry is None

    @property
    def plain_http(self) -> bool:
        """Reached over plain HTTP as docker does for a registry on the loopback network
        (``127.0.0.0/8``, ``::1``, ``localhost``); ``registries.conf``'s ``insecure`` is
        honoured by skopeo itself."""
        if self.registry is None:
            return False
        host = self.registry.rsplit(":", 1)[0] if not self.registry.endswith("]") else self.registry
        host = host.strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def is_image_reference(image: str) -> bool:
    """``True`` when ``image`` names a container image rather than ``"host"`` or a root
    filesystem directory (also when it is not a valid reference: pulling it says why)."""
    try:
        return parse(image) is not None
    except ValueError:
        return True


def parse(image: str) -> Reference | None:
    """The reference ``image`` names, or ``None`` for ``"host"`` and root filesystem paths.

    Raises:
        ValueError: ``image`` is neither a path nor a valid reference (the message says why).
    """
    if image == "host" or image.startswith(("/", "./", "../", "~")) or os.path.isdir(image):
        return None
    if image.startswith(LOCAL_TRANSPORTS):
        return Reference(image, image, None, by_digest=False)
    text = image.removeprefix("docker://")
    match = _REFERENCE.match(text)
    if match is None:
        raise ValueError(
            f"image {image!r} is neither 'host', a root filesystem directory, a local source "
            f"({', '.join(t + '...' for t in LOCAL_TRANSPORTS)}) nor a docker reference such "
            f"as 'python:3.12' or 'registry.example:5000/name@sha256:<hex>'"
        )
    domain = match["domain"]
    if domain and not ("." in domain or ":" in domain or domain == "localhost" or "[" in domain):
        domain = None  # "swebench/x": a Docker Hub namespace, not a host
    registry = domain if domain else "docker.io"
    return Reference(image, "docker://" + text, registry, by_digest=match["digest"] is not None)
