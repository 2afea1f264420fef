"""The files a container runtime writes into every container, for ``local`` image sandboxes.

Docker (and Podman) give each container an ``/etc/hosts`` naming ``localhost`` and the
container's hostname, an ``/etc/hostname`` and an ``/etc/resolv.conf``: images do not carry
them (the engine bind-mounts its own over whatever the image has). Without them a sandbox of
an image cannot resolve ``localhost`` (a test server on ``localhost`` fails with
``getaddrinfo EAI_AGAIN``). Here they are written into the sandbox's own writable layer
(``upper``), never into the shared layers, before each start of its jail:

* ``/etc/hosts``: Docker's default records (moby ``libnetwork/etchosts``; the IPv6 ones only
  when the sandbox's loopback has ``::1``: a server told ``localhost`` may listen on the
  first address it gets), then ``127.0.0.1`` for the
  hostname: the sandbox's only address of its own is its loopback (no network), or the host's
  (network on, which shares the host's network namespace, as ``docker run --network host``);
* ``/etc/hostname``: the hostname (:func:`sandbox_hostname`), which the jail also sets as its
  UTS name;
* ``/etc/resolv.conf``: with the network on, the host's own (its loopback nameservers kept, as
  ``--network host`` keeps them: the network namespace is the host's, so a
  ``systemd-resolved`` stub at ``127.0.0.53`` answers); with it off, empty (nothing to ask;
  a lookup then fails at once, on the sandbox's own loopback).

Only for container images: ``image="host"`` (the host's root) and a root filesystem directory
keep their own ``/etc`` and the host's hostname, as the root is not the sandbox's to rewrite.

The writable layer is the sandbox's: after a restart (an environment recipe installs with the
network, then the jail restarts without it) what its commands left there is written through
directory descriptors, never through a path, so a link planted at ``etc`` or at a file's
name cannot lead the host's write elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from sandlot.errors import SandboxStartError
from sandlot.images import ImageRoot

DOCKER_HOSTS_IPV4 = (("127.0.0.1", "localhost"),)
DOCKER_HOSTS_IPV6 = (
    ("::1", "localhost ip6-localhost ip6-loopback"),
    ("fe00::0", "ip6-localnet"),
    ("ff00::0", "ip6-mcastprefix"),
    ("ff02::1", "ip6-allnodes"),
    ("ff02::2", "ip6-allrouters"),
)
"""Docker's default ``/etc/hosts`` records, in its order (``IP<TAB>names``)."""

HOSTNAME_FILE = "hostname"
"""In the sandbox's host directory (never visible to its commands): its hostname, which a
zygote's child sets (``zygote.HOSTNAME``, the same name; that file is not imported here)."""

_FILE_MODE = 0o644  # as Docker's
_ETC_MODE = 0o755  # an image without /etc
_HOST_RESOLV = "/etc/resolv.conf"
_IPV6_LOOPBACK = "0" * 31 + "1"  # ::1 as /proc/net/if_inet6 writes it


class RuntimeFilesError(SandboxStartError):
    """The runtime files cannot be written (the sandbox's ``/etc`` is not a directory): the
    sandbox cannot (re)start."""


def sandbox_hostname(sandbox_id: str) -> str:
    """The hostname of the sandbox ``sandbox_id`` (``sandlot-<12 hex>``): its 12 hex digits,
    as Docker names a container by the first 12 of its id."""
    return sandbox_id.rpartition("-")[2][:63] or "sandlot"


def loopback_has_ipv6(network: bool) -> bool:
    """Whether the sandbox's loopback has ``::1``: the host's (``network``), else a new
    network namespace's, whose loopback gets ``::1`` when IPv6 is on by default."""
    if network:
        try:
            lines = Path("/proc/net/if_inet6").read_text().splitlines()
        except OSError:
            return False
        return any(line.split()[:1] == [_IPV6_LOOPBACK] for line in lines)
    try:
        return Path("/proc/sys/net/ipv6/conf/default/disable_ipv6").read_text().strip() == "0"
    except OSError:
        return False


def hosts_file(hostname: str, ipv6: bool) -> bytes:
    """``/etc/hosts`` as Docker writes it, the hostname at ``127.0.0.1`` (see the module
    docstring)."""
    records = [*DOCKER_HOSTS_IPV4, *(DOCKER_HOSTS_IPV6 if ipv6 else ()), ("127.0.0.1", hostname)]
    return "".join(f"{ip}\t{names}\n" for ip, names in records).encode()


def resolv_conf(network: bool, host_file: str = _HOST_RESOLV) -> bytes:
    """``/etc/resolv.conf`` of a sandbox: the host's (``host_file``, links followed) when
    ``network``, else empty; empty too when the host has none (its resolver then asks
    ``127.0.0.1``, as the sandbox's will)."""
    if not network:
        return b""
    try:
        return Path(host_file).read_bytes()
    except OSError:
        return b""


def etc_mode(image: ImageRoot) -> int | None:
    """The mode of the image's ``/etc`` (0755 when it has none); ``None`` when ``/etc`` is a
    link (a directory named ``etc`` in the writable layer would hide it, and the image's
    files with it)."""
    found = image.lookup("/etc")
    if found is None:
        return _ETC_MODE
    if found.name != "etc" or found.parent not in image.layers:
        return None  # resolved elsewhere: a link
    mode = image.mode("/etc")
    return _ETC_MODE if mode is None else stat.S_IMODE(mode)


def write_runtime_files(upper: Path, hostname: str, network: bool, mode: int = _ETC_MODE) -> None:
    """Write ``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` into the writable
    layer ``upper`` (an overlayfs upper directory that is not mounted now), making ``etc``
    there with ``mode`` (the image's, from :func:`etc_mode`) if missing. Each file is written
    under a temporary name and renamed over the old one, through descriptors.

    Raises:
        RuntimeFilesError: ``upper/etc`` is not a directory (a sandbox's command made it a
            link or a file).
        OSError: a write failed.
    """
    files = {
        "hosts": hosts_file(hostname, loopback_has_ipv6(network)),
        "hostname": f"{hostname}\n".encode(),
        "resolv.conf": resolv_conf(network),
    }
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(upper, flags)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir("etc", mode, dir_fd=top)
            os.chmod("etc", mode, dir_fd=top)  # not narrowed by our umask
        try:
            etc = os.open("etc", flags, dir_fd=top)
        except OSError as exc:  # ELOOP (a link) or ENOTDIR (a file)
            raise RuntimeFilesError(
                f"cannot write the sandbox's /etc/hosts: /etc in its writable layer {upper} "
                f"is not a directory ({exc.strerror})"
            ) from exc
    finally:
        os.close(top)
    try:
        for name, data in files.items():
            _replace(etc, name, data)
    finally:
        os.close(etc)


def _replace(directory: int, name: str, data: bytes) -> None:
    temporary = f".sandlot-{name}.new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary, dir_fd=directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(temporary, flags, _FILE_MODE, dir_fd=directory), "wb") as out:
        os.fchmod(out.fileno(), _FILE_MODE)  # not narrowed by our umask
        out.write(data)
    # rename(2) replaces whatever ``name`` is (a link too), never what a link leads to.
    os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
