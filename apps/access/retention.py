"""Retention of logins: expired sessions and django-axes' access logs (docs/operations.md,
Retention).

Django keeps a session row until someone deletes it (its `clearsessions`); axes writes an
access log row for every successful login (and, when AXES_ENABLE_ACCESS_FAILURE_LOG is on,
one per failure) and never deletes them. Axes' lockout counters (AccessAttempt) need nothing:
axes deletes those past their cool-off at every login attempt. The audit log records every
action on its own (apps.audit); these rows only serve the lockouts and the admin's pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from axes.models import AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.sessions.models import Session

from apps.core.prune import expired_delete


@dataclass
class LoginsPruned:
    sessions: int = 0
    access_logs: int = 0


def logins_prune(*, now: datetime) -> LoginsPruned:
    """Delete expired sessions, and login records older than LOGIN_LOG_RETENTION_DAYS (0:
    kept forever), in bounded batches."""
    result = LoginsPruned()
    result.sessions = expired_delete(
        table=Session._meta.db_table, expired="expire_date < %(cutoff)s", params={"cutoff": now}
    )
    if days := settings.LOGIN_LOG_RETENTION_DAYS:
        cutoff = {"cutoff": now - timedelta(days=days)}
        for model in (AccessLog, AccessFailureLog):
            result.access_logs += expired_delete(
                table=model._meta.db_table, expired="attempt_time < %(cutoff)s", params=cutoff
            )
    return result
