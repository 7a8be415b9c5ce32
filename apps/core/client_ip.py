"""The address of the client behind a request: the one function every reader of it uses
(the audit log, django-axes' lockouts through AXES_CLIENT_IP_CALLABLE)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_ip(request: HttpRequest) -> str | None:
    """The client's address, or None when the peer's is unknown or not an IP address.

    REMOTE_ADDR (the peer), unless the peer is one of TRUSTED_PROXIES: then X-Forwarded-For
    is walked from the right, skipping trusted proxies, and the first untrusted address is
    the client. Each proxy appends the address it was connected from, so only the entries
    right of the first untrusted one were written by proxies we trust; anything further left
    is whatever the client sent. When every hop is trusted, the leftmost one; when an entry
    is not an address (a trusted proxy writes none such), the last trusted hop before it."""
    peer = _address(request.META.get("REMOTE_ADDR", ""))
    trusted = _networks(tuple(settings.TRUSTED_PROXIES))
    if peer is None or not _in(peer, trusted):
        return str(peer) if peer is not None else None
    client = peer
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    for entry in reversed(forwarded.split(",")):
        hop = _address(entry)
        if hop is None:
            break
        client = hop
        if not _in(hop, trusted):
            break
    return str(client)


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    # an IPv4 peer of a dual-stack socket reads ::ffff:a.b.c.d; TRUSTED_PROXIES say a.b.c.d
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _in(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address in network for network in networks)


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)
