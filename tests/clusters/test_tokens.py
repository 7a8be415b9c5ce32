import subprocess
import sys

import pytest
from django.db import connection

from apps.clusters.models import AgentToken, Cluster
from apps.clusters.selectors import token_authenticate
from apps.clusters.services import token_issue, token_revoke
from launcher.procs import ROOT

pytestmark = pytest.mark.django_db


def test_it_stores_no_plaintext_secret_anywhere_in_the_database():
    token, secret = token_issue(cluster_name="alpha", name="n1")
    assert token.digest != secret and secret not in token.digest
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND data_type IN ('text', 'character varying', 'jsonb')"
        )
        for table, column in cursor.fetchall():
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text LIKE %s',
                [f"%{secret[6:]}%"],
            )
            assert cursor.fetchone()[0] == 0, f"secret found in {table}.{column}"


def test_it_authenticates_by_secret_and_not_after_revocation():
    token, secret = token_issue(cluster_name="alpha")
    assert token_authenticate(secret=secret) == token
    token_revoke(token=token)
    assert token_authenticate(secret=secret) is None


def test_issue_token_creates_the_cluster_and_prints_a_working_token(transactional_db):
    done = subprocess.run(
        [sys.executable, "manage.py", "issue_token", "new-cluster", "--name", "gpu-agents"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "DATABASE_URL": _url()},
    )
    secret = done.stdout.strip()
    token = token_authenticate(secret=secret)
    assert token is not None and token.cluster.name == "new-cluster"
    assert token.name == "gpu-agents"
    assert Cluster.objects.filter(name="new-cluster").count() == 1
    assert AgentToken.objects.get().digest != secret


def _url() -> str:
    from tests.stackproc import database_url

    return database_url(connection.settings_dict)
