"""A request without a session cookie is answered 401 by the operations that take a session,
not 403 "CSRF check Failed" (found by the fuzz test, tests/api/test_schemathesis.py); a
session still needs its CSRF token for anything that is not a GET."""

import uuid

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.test import Client

from apps.access.services import role_grant
from apps.clusters.services import token_issue

WRITES = ("/api/v1/commands", "/api/v1/alerts/1/ack")


def test_it_answers_401_to_a_write_without_any_credential(db):
    for path in WRITES:
        response = Client(enforce_csrf_checks=True).post(path, {}, content_type="application/json")
        assert response.status_code == 401, path
        assert response.json()["errors"][0]["loc"] == "Authorization"


def test_it_answers_401_to_an_agent_token_on_a_people_only_write(db):
    _, secret = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="agent")
    client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {secret}"})
    for path in WRITES:
        response = client.post(path, {}, content_type="application/json")
        assert response.status_code == 401, path


def test_a_cookie_that_names_no_logged_in_session_is_no_credential(db):
    """An agent token beside a stale or made-up session cookie: 401, not a CSRF 403."""
    _, secret = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="agent")
    client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {secret}"})
    client.cookies[settings.SESSION_COOKIE_NAME] = "made-up-session"
    for path in WRITES:
        response = client.post(path, {}, content_type="application/json")
        assert response.status_code == 401, (path, response.content)


def test_a_session_without_its_csrf_token_is_still_refused(db):
    token, _ = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="agent")
    user = get_user_model().objects.create_user("csrf-operator")
    role_grant(user=user, cluster=token.cluster, role="operator")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = {"kind": "cordon", "node": "node-01"}
    refused = client.post(
        "/api/v1/commands", body, content_type="application/json", headers={"Idempotency-Key": "k1"}
    )
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["errors"][0]["msg"]
    page = HttpRequest()
    csrf = get_token(page)  # as a page renders it, with the cookie it sets
    client.cookies[settings.CSRF_COOKIE_NAME] = page.META["CSRF_COOKIE"]
    let_in = client.post(
        "/api/v1/commands",
        body,
        content_type="application/json",
        headers={"Idempotency-Key": "k2", "X-CSRFToken": csrf},
    )
    assert let_in.status_code not in (401, 403), let_in.content  # 404: no such node
