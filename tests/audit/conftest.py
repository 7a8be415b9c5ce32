"""Fixtures of the audit tests: two clusters, and a runtime role as docs/security.md makes it."""

import uuid

import pytest
from django.db import connection
from psycopg import sql

from tests.access.conftest import clusters  # noqa: F401  (the two-cluster fixture)


@pytest.fixture
def runtime_role(transactional_db):
    """A login role granted what docs/security.md grants on the audit table, and nothing
    else of it; dropped after the test."""
    role = f"opsboard_runtime_{uuid.uuid4().hex[:8]}"
    name = sql.Identifier(role)
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE ROLE {} LOGIN").format(name).as_string())
        cursor.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name).as_string())
        cursor.execute(
            sql.SQL("GRANT SELECT, INSERT ON audit_auditentry TO {}").format(name).as_string()
        )
        cursor.execute(
            sql.SQL("GRANT USAGE ON SEQUENCE audit_auditentry_id_seq TO {}")
            .format(name)
            .as_string()
        )
    yield role
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("DROP OWNED BY {}").format(name).as_string())
        cursor.execute(sql.SQL("DROP ROLE {}").format(name).as_string())
