"""``network="internet"``'s address space: every public IPv4 address, nothing else."""

from __future__ import annotations

import ipaddress
import random

from sandlot.sandboxes.modal.network import NON_PUBLIC_NETWORKS, public_cidrs


def test_public_cidrs_cover_exactly_the_public_ipv4_space() -> None:
    blocks = [ipaddress.IPv4Network(c) for c in public_cidrs()]
    excluded = [ipaddress.IPv4Network(c) for c in NON_PUBLIC_NETWORKS]
    assert not any(b.overlaps(other) for i, b in enumerate(blocks) for other in blocks[i + 1 :])
    assert not any(b.overlaps(e) for b in blocks for e in excluded)
    total = sum(b.num_addresses for b in blocks) + sum(e.num_addresses for e in excluded)
    assert total == 2**32  # the two lists partition the address space
    rng = random.Random(7)
    for _ in range(2000):
        address = ipaddress.IPv4Address(rng.getrandbits(32))
        public = address.is_global and not address.is_multicast
        assert any(address in b for b in blocks) == public, address
