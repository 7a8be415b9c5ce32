"""Expired sessions go at every retention pass; login records (django-axes' access logs) go
LOGIN_LOG_RETENTION_DAYS after the login."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from axes.models import AccessFailureLog, AccessLog
from django.contrib.sessions.models import Session

from apps.access.tasks import prune_logins

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)
DAY = timedelta(days=1)


def login(model, username: str, at: datetime) -> int:
    made = model.objects.create(username=username, user_agent="t", http_accept="*/*", path_info="/")
    model.objects.filter(pk=made.pk).update(attempt_time=at)  # auto_now_add
    return made.pk


def test_it_deletes_expired_sessions_and_old_login_records():
    Session.objects.create(session_key="expired-ret", session_data="", expire_date=NOW - DAY)
    Session.objects.create(session_key="live-ret", session_data="", expire_date=NOW + DAY)
    old = [login(AccessLog, "old", NOW - 91 * DAY), login(AccessFailureLog, "old", NOW - 91 * DAY)]
    young = [login(AccessLog, "new", NOW - 89 * DAY)]

    result = prune_logins()

    assert set(Session.objects.values_list("session_key", flat=True)) == {"live-ret"}
    assert not AccessLog.objects.filter(pk=old[0]).exists()
    assert not AccessFailureLog.objects.filter(pk=old[1]).exists()
    assert AccessLog.objects.filter(pk=young[0]).exists()
    assert result == {"sessions": 1, "access_logs": 2}
