"""Who may scrape /metrics: a bearer token (METRICS_TOKEN) or a client address in
METRICS_ALLOWED_NETS (apps.core.client_ip: X-Forwarded-For only from TRUSTED_PROXIES).

The token is compared as SHA-256 digests with hmac.compare_digest: constant time, whatever
the length of what was sent. With neither setting the scrape is refused to everyone (403):
behind a reverse proxy on the same host every client would otherwise look like loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.core.client_ip import client_ip


def scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may scrape, else the 401 (token expected, missing or wrong)
    or 403 (no token configured and the address is not allowed) to answer."""
    if _address_allowed(client_ip(request)):
        return None
    expected = _digest(settings.METRICS_TOKEN)
    if expected is None:
        return _refuse(403, "client", "this address may not scrape (METRICS_ALLOWED_NETS)")
    scheme, _, presented = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        hashlib.sha256(presented.strip().encode()).digest(), expected
    ):
        return None
    response = _refuse(401, "Authorization", "a valid scrape token is required")
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _refuse(status: int, loc: str, msg: str) -> HttpResponse:
    return JsonResponse({"errors": [{"loc": loc, "msg": msg}]}, status=status)


@lru_cache(maxsize=4)
def _digest(token: str) -> bytes | None:
    return hashlib.sha256(token.encode()).digest() if token else None


def _address_allowed(address: str | None) -> bool:
    if address is None:
        return False
    networks = _networks(tuple(settings.METRICS_ALLOWED_NETS))
    ip = ipaddress.ip_address(address)
    return any(ip in network for network in networks)


@lru_cache(maxsize=8)
def _networks(
    entries: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)
