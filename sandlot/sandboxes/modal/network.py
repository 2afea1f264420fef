"""The address space of ``network="internet"``: the public IPv4 internet, without the host or
any private, shared or special-purpose range.

Backends that can restrict egress by destination (Modal's ``outbound_cidr_allowlist``) allow
exactly :func:`public_cidrs`. The excluded ranges are those of IANA's IPv4 special-purpose
registry (RFC 6890 and its updates, https://www.iana.org/assignments/iana-ipv4-special-registry):
loopback, RFC 1918 private networks, carrier-grade NAT, link-local (which holds the cloud
metadata endpoint ``169.254.169.254``), documentation and benchmarking ranges, multicast and the
reserved blocks.
"""

from __future__ import annotations

import functools
import ipaddress

NON_PUBLIC_NETWORKS: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private (RFC 1918)
    "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
    "127.0.0.0/8",  # loopback: the host's own services
    "169.254.0.0/16",  # link-local: cloud metadata endpoints
    "172.16.0.0/12",  # private (RFC 1918)
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",  # private (RFC 1918)
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast address
)
"""IPv4 destinations ``network="internet"`` never reaches (CIDR notation)."""


@functools.cache
def public_cidrs() -> tuple[str, ...]:
    """The IPv4 blocks covering every address outside :data:`NON_PUBLIC_NETWORKS`.

    IPv6 is left out on purpose: an allowlist of these blocks blocks IPv6 egress, where the
    private and special ranges (and IPv4-embedding prefixes such as ``::ffff:0:0/96``) would
    take some 300 more blocks to carve out.

    Returns:
        116 blocks (strings such as ``"8.0.0.0/7"``), sorted by address, that together cover
        ``0.0.0.0/0`` minus the excluded ranges.
    """
    remaining = [ipaddress.IPv4Network("0.0.0.0/0")]
    for excluded in map(ipaddress.IPv4Network, NON_PUBLIC_NETWORKS):
        kept: list[ipaddress.IPv4Network] = []
        for block in remaining:
            kept.extend(block.address_exclude(excluded) if block.overlaps(excluded) else [block])
        remaining = kept
    return tuple(str(b) for b in sorted(remaining))
