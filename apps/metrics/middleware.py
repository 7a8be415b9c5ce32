"""ProbeMiddleware: /healthz, /readyz and /metrics answered first (see apps.metrics.views)."""

from __future__ import annotations

from apps.metrics import views

PROBES = {"/healthz": views.healthz, "/readyz": views.readyz, "/metrics": views.metrics}


class ProbeMiddleware:
    """First in MIDDLEWARE but for DatabaseUnavailableMiddleware (which only rewrites 500s):
    a GET of a probe path is answered here, before the host check, the HTTPS redirect,
    sessions and the ingest pool's path filter (every pool answers the probes: each is its
    own pod)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        view = PROBES.get(request.path_info)
        if view is not None and request.method in ("GET", "HEAD"):
            return view(request)
        return self.get_response(request)
