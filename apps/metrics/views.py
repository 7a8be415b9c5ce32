"""The probes and the scrape: /healthz (the process answers), /readyz (it can serve: the
database and the broker answer, every migration is applied), /metrics (Prometheus).

They are answered by ProbeMiddleware (apps.metrics.middleware) before any other middleware,
so a kubelet or Prometheus reaching the pod's own address (a Host header not in
ALLOWED_HOSTS, plain HTTP) gets its answer, and no session, CSRF or redirect gets in the way.
None of them builds a URL from the Host header, which is what ALLOWED_HOSTS protects.
"""

from __future__ import annotations

import logging
from functools import cache

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.core.redis import redis_connect
from apps.metrics.auth import scrape_refusal
from apps.metrics.collect import exposition

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 1.0
# The classic text format, which every Prometheus reads (prometheus_client's "latest" is
# 1.0.0 from 0.22 on); every name here is a classic one, so the body is the same.
EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_migrated = False  # once every migration is applied, they stay applied: not checked again


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    """200 {"ready": true, "checks": {...}} or 503 naming each check that failed."""
    checks = {"database": _database(), "broker": _broker()}
    checks["migrations"] = _migrations() if checks["database"] == "ok" else "not checked"
    ready = all(result == "ok" for result in checks.values())
    body = {"ready": ready, "checks": checks}
    if not ready:
        body["not_ready"] = [name for name, result in checks.items() if result != "ok"]
    return JsonResponse(body, status=200 if ready else 503)


def metrics(request: HttpRequest) -> HttpResponse:
    refusal = scrape_refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = exposition()
    except DatabaseError as exc:
        logger.warning("metrics: the database is unavailable (%s)", exc)
        return JsonResponse(
            {"errors": [{"loc": "database", "msg": "the database is unavailable"}]}, status=503
        )
    return HttpResponse(body, content_type=EXPOSITION_TYPE)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


@cache
def _broker_client(url: str) -> redis.Redis:
    return redis_connect(url, timeout=BROKER_TIMEOUT_S, connect_timeout=BROKER_TIMEOUT_S)


def _broker() -> str:
    try:
        _broker_client(settings.CELERY_BROKER_URL).ping()
    except redis.RedisError as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


def _migrations() -> str:
    global _migrated
    if _migrated:
        return "ok"
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        return f"unreachable: {type(exc).__name__}"
    if pending:
        return f"{len(pending)} not applied, first {pending[0][0].app_label}.{pending[0][0].name}"
    _migrated = True
    return "ok"
