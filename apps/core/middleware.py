"""Refuses requests that no view can serve, before any view or query sees them; answers 503,
not 500, to one that found the database unavailable."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from django.conf import settings
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse

from apps.core.db_wait import request_bound
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


# What a request that found the database unreachable (down, restarting, frozen past its
# bounds: docs/faults.md) raises from anywhere: a view, the session or user middleware.
DATABASE_DOWN = (OperationalError, InterfaceError)


class DatabaseUnavailableMiddleware:
    """First in MIDDLEWARE: each wait of the request for the database is bounded
    (DB_REQUEST_TIMEOUT, apps/core/db_wait.py), and a request that failed because the
    database is unavailable is answered 503 with Retry-After (INGEST_RETRY_AFTER), as the
    API's handler answers (opsboard/api.py), never 500. A view's exception is answered by
    process_exception; one from a middleware Django turns into a 500 response inside that
    middleware, so it is recognised where Django reports it (got_request_exception, sent
    while it is being handled) and the 500 is replaced here."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        got_request_exception.connect(_database_down_mark, dispatch_uid=__name__)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with request_bound(settings.DB_REQUEST_TIMEOUT):
            response = self.get_response(request)
        if response.status_code == 500 and getattr(request, "database_down", False):
            return database_unavailable()
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A view's: answered at once, before Django builds a 500 page (DEBUG's reads the
        user and the session again: another pool timeout for each)."""
        return database_unavailable() if isinstance(exception, DATABASE_DOWN) else None


def _database_down_mark(sender, request: HttpRequest | None = None, **_: object) -> None:
    if request is not None and isinstance(sys.exc_info()[1], DATABASE_DOWN):
        request.database_down = True  # type: ignore[attr-defined]


def database_unavailable() -> HttpResponse:
    response = error_response(503, [{"loc": "", "msg": "database unavailable, retry later"}])
    response["Retry-After"] = str(settings.INGEST_RETRY_AFTER)
    return response
