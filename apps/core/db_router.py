"""Reads from a streaming replica, where they may be a little stale (docs/operations.md).

The router sends a read to the "replica" database only inside a request that
`ReplicaMiddleware` allowed (a GET or HEAD, from a client that has not written in the last
REPLICA_STICKY_SECONDS), inside a view marked `replica_reads`, outside any atomic block,
before the request wrote anything, and for a model whose rows say nothing about who may do
what. Everything else reads from the primary: writes, workers, commands, long-polls, the
reads of a request that wrote, and every authentication and role check, so that a revoked
role or token takes effect at once.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, HttpResponse

REPLICA = "replica"
SAFE_METHODS = ("GET", "HEAD")
# A response to a client that wrote sets this cookie; while it lives, that client's reads
# stay on the primary (it sees its own action, whatever the replica's lag).
STICKY_COOKIE = "opsboard_primary"
# Rows that decide who may do what, read on the primary always: users, sessions,
# permissions, roles, personal and agent tokens, login lockouts.
PRIMARY_APPS = frozenset({"auth", "sessions", "contenttypes", "admin", "access", "axes"})
PRIMARY_MODELS = frozenset({"clusters.agenttoken"})


@dataclass
class _RequestReads:
    allowed: bool  # a GET/HEAD from a client without a recent write
    active: bool = False  # inside a view marked replica_reads
    wrote: bool = False  # the request sent a write: its reads stay on the primary after


_reads: contextvars.ContextVar[_RequestReads | None] = contextvars.ContextVar(
    "opsboard_replica_reads", default=None
)


def replica_reads_active() -> bool:
    """Whether a read here may go to the replica (a role check must then read the primary
    explicitly: a join to a role would otherwise be read on the replica with the rest)."""
    reads = _reads.get()
    return reads is not None and reads.allowed and reads.active and not reads.wrote


def read_alias() -> str:
    """The database a selector's own SQL reads (it bypasses the router): "replica" where a
    model's read would go there, else "default". For telemetry, runs and history only;
    never for a role or a token."""
    if not replica_reads_active() or REPLICA not in settings.DATABASES:
        return DEFAULT_DB_ALIAS
    return DEFAULT_DB_ALIAS if connections[DEFAULT_DB_ALIAS].in_atomic_block else REPLICA


def _on_primary_only(model: Any) -> bool:
    meta = model._meta
    return meta.app_label in PRIMARY_APPS or meta.label_lower in PRIMARY_MODELS


class ReplicaRouter:
    """db_for_read: "replica" where the request allows it (above), else the primary."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if not replica_reads_active():
            return None
        if _on_primary_only(model) or connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return None
        return REPLICA

    def db_for_write(self, model: Any, **hints: Any) -> str:
        reads = _reads.get()
        if reads is not None:
            reads.wrote = True
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # the replica holds the primary's rows

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS


def replica_reads(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a read-only view (a page or an API list) whose reads may come from the replica:
    up to its lag behind the primary, never for a client that just wrote."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        reads = _reads.get()
        if reads is None:
            return view(request, *args, **kwargs)
        reads.active = True
        try:
            return view(request, *args, **kwargs)
        finally:
            reads.active = False

    return wrapper


class ReplicaMiddleware:
    """Allows replica reads for a GET or HEAD from a client without a recent write, and
    makes a browser that wrote read from the primary for REPLICA_STICKY_SECONDS (a cookie):
    after a POST, the page it redirects to shows the action just taken."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        sticky = STICKY_COOKIE in request.COOKIES
        reads = _RequestReads(allowed=request.method in SAFE_METHODS and not sticky)
        token = _reads.set(reads)
        try:
            response = self.get_response(request)
        finally:
            _reads.reset(token)
        # a browser's (it sent a cookie: the session's, or the CSRF token's of a login form);
        # an agent or a token client keeps no cookie, and its answer carries none
        if request.COOKIES and (reads.wrote or request.method not in SAFE_METHODS):
            seconds = settings.REPLICA_STICKY_SECONDS
            response.set_cookie(
                STICKY_COOKIE,
                str(int(time.time() + seconds)),
                max_age=seconds,
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
        return response
