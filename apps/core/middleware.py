"""Refuses requests that no view can serve, before any view or query sees them."""

from __future__ import annotations

from collections.abc import Iterable

from django.http import HttpRequest, HttpResponse

from apps.core.errors import error_response

NUL = "\x00"
NUL_MESSAGE = "must not contain a NUL character"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# The ingest body is the ingest view's to decode and bound (apps/ingest/middleware.py).
UNCHECKED_BODIES = ("/api/v1/ingest",)


class RequestSanityMiddleware:
    """A NUL character — raw or %00-encoded — in the URL path, a query parameter or a form
    field is answered 400 naming where it was. Postgres can neither store nor compare a
    string holding NUL, so such a value, used as a name anywhere, would fail deep inside a
    query as a 500."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = nul_field(request)
        if where is not None:
            return error_response(400, [{"loc": where, "msg": NUL_MESSAGE}])
        return self.get_response(request)


def nul_field(request: HttpRequest) -> str | None:
    """Where the request holds a NUL: "path", a parameter's name, or None."""
    if NUL in request.path_info:
        return "path"
    where = _nul_in(request.GET.lists(), "query")
    if where is None and _has_form_body(request):
        where = _nul_in(request.POST.lists(), "body")
    return where


def _nul_in(fields: Iterable[tuple[str, list[str]]], whole: str) -> str | None:
    for name, values in fields:
        if NUL in name:
            return whole  # a name holding a NUL cannot name itself
        if any(NUL in value for value in values):
            return name
    return None


def _has_form_body(request: HttpRequest) -> bool:
    return (
        request.method == "POST"
        and request.content_type in FORM_TYPES
        and request.path_info not in UNCHECKED_BODIES
    )
