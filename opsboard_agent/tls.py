"""Connections to the Opsboard server: plain HTTP, or HTTPS verified against the system's
trust store or, with `--ca-file`, against that CA bundle alone (a private CA)."""

from __future__ import annotations

import http.client
import ssl


def server_connection(
    scheme: str, netloc: str, timeout: float, ca_file: str | None = None
) -> http.client.HTTPConnection:
    """A connection to `netloc`: HTTPS when `scheme` says so, verified (host name included)."""
    if scheme != "https":
        return http.client.HTTPConnection(netloc, timeout=timeout)
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    return http.client.HTTPSConnection(netloc, timeout=timeout, context=context)
