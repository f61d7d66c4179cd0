"""Addresses of listening sockets, as the tests that check what listens where read them."""

from __future__ import annotations

import ipaddress


def loopback(ip: str) -> bool:
    """Whether ``ip`` (IPv4, IPv6 or IPv4-mapped, with an optional ``%zone``) is loopback."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
