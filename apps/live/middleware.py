"""The Content-Security-Policy (django-csp) with the live websocket's own port allowed."""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.http.request import split_domain_port


class LiveCSPMiddleware(CSPMiddleware):
    """CSP's 'self' covers ws:/wss: to the page's own host and port only. When the ASGI
    server listens on another port (LIVE_WS_PORT, beside a WSGI server), the pages open their
    websocket there: connect-src names that host and port, and nothing wider."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        port = settings.LIVE_WS_PORT
        if port and not report_only:
            # get_host() is checked against ALLOWED_HOSTS; the page opens location.hostname
            host, _ = split_domain_port(request.get_host())
            sockets = [f"ws://{host}:{port}", f"wss://{host}:{port}"]
            update = dict(parts.update or {})
            update["connect-src"] = [*update.get("connect-src", []), *sockets]
            parts.update = update
        return parts
