"""Personal API tokens: issued by a command, act as their user with that user's roles,
refused once revoked; issuing and revoking are audited."""

import io

import pytest
from django.core.management import call_command
from django.test import Client

from apps.access.models import UserToken
from apps.access.services import user_token_revoke
from apps.audit.models import AuditEntry
from tests.access.conftest import user_with

pytestmark = pytest.mark.django_db


def issue(username: str) -> str:
    out = io.StringIO()
    call_command("issue_user_token", username, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def read(secret: str, path: str):
    return Client().get(path, headers={"Authorization": f"Bearer {secret}"})


def test_it_prints_a_token_stored_only_as_a_digest(clusters):
    user_with("vera", alpha="viewer")
    secret = issue("vera")
    token = UserToken.objects.get()
    assert secret.startswith("obu_") and secret.startswith(token.prefix)
    assert secret not in (token.digest, token.prefix)
    entry = AuditEntry.objects.get(action="token.issue", detail__token=token.prefix)
    assert entry.target == "user:vera" and entry.outcome == "succeeded"


def test_it_reads_as_its_user_within_that_users_clusters(clusters):
    user_with("vera", alpha="viewer")
    secret = issue("vera")
    assert read(secret, "/api/v1/runs/run-1?cluster=alpha").status_code == 200
    assert read(secret, "/api/v1/runs/run-1?cluster=beta").status_code == 404


def test_it_refuses_a_revoked_or_unknown_token(clusters):
    user_with("vera", alpha="viewer")
    secret = issue("vera")
    token = UserToken.objects.get()
    user_token_revoke(token=token)
    assert read(secret, "/api/v1/runs/run-1?cluster=alpha").status_code == 401
    assert read("obu_nope", "/api/v1/runs/run-1?cluster=alpha").status_code == 401
    revokes = AuditEntry.objects.filter(action="token.revoke", detail__token=token.prefix)
    assert revokes.count() == 1
