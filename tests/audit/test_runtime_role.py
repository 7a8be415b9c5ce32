"""docs/security.md's role split, tried on the test database: a runtime role granted only
INSERT and SELECT on the audit table (it does not own it) appends entries, and can neither
change, delete nor truncate them, nor drop, alter or disable the triggers that guard them."""

import uuid

import psycopg
import pytest
from django.db import connection
from psycopg import errors

from apps.audit.models import AuditEntry

# each tried as the runtime role; every one must be refused for want of privilege
REFUSED = [
    "UPDATE audit_auditentry SET outcome = 'denied'",
    "DELETE FROM audit_auditentry",
    "TRUNCATE audit_auditentry",
    "ALTER TABLE audit_auditentry DISABLE TRIGGER ALL",
    "ALTER TABLE audit_auditentry DISABLE TRIGGER pgtrigger_audit_append_only_e1503",
    "DROP TRIGGER pgtrigger_audit_no_truncate_4108f ON audit_auditentry",
    "ALTER TABLE audit_auditentry RENAME TO audit_old",
    "DROP TABLE audit_auditentry",
    # what a superuser would use to skip every trigger of the session
    "SET session_replication_role = replica",
]
INSERT = """
INSERT INTO audit_auditentry (at, actor_kind, actor_name, action, cluster_name, target,
                              reason, outcome, detail, request_id)
VALUES (now(), 'user', 'runtime', 'role.test', '', %s, '', 'allowed', '{}', '')
RETURNING id
"""


def connect_as(role: str) -> psycopg.Connection:
    params = connection.settings_dict
    return psycopg.connect(
        host=params["HOST"] or "127.0.0.1", port=params["PORT"] or 5432,
        dbname=params["NAME"], user=role, password=params["PASSWORD"] or None,
        autocommit=True,
    )  # fmt: skip


def test_the_runtime_role_appends_and_cannot_bend_the_log(runtime_role):
    target = f"runtime:{uuid.uuid4().hex}"
    with connect_as(runtime_role) as runtime:
        [entry_id] = runtime.execute(INSERT, [target]).fetchone()
        refused = {}
        for statement in REFUSED:
            try:
                runtime.execute(statement)
            except errors.InsufficientPrivilege as error:
                refused[statement] = str(error)
        # pgtrigger lets a session name triggers to skip (pgtrigger.ignore): it does not
        # matter to a role that holds no UPDATE privilege
        runtime.execute("SELECT set_config('pgtrigger.ignore', %s, false)",
                        ["{audit_auditentry:pgtrigger_audit_append_only_e1503}"])  # fmt: skip
        with pytest.raises(errors.InsufficientPrivilege):
            runtime.execute("UPDATE audit_auditentry SET reason = 'x' WHERE id = %s", [entry_id])
        [(seen,)] = runtime.execute(
            "SELECT target FROM audit_auditentry WHERE id = %s", [entry_id]
        ).fetchall()
    assert sorted(refused) == sorted(REFUSED), set(REFUSED) - set(refused)
    assert seen == target
    kept = AuditEntry.objects.get(pk=entry_id)
    assert (kept.target, kept.outcome, kept.reason) == (target, "allowed", "")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'audit_auditentry'::regclass"
            " AND tgenabled <> 'D' AND NOT tgisinternal"
        )
        assert cursor.fetchone()[0] == 2  # both triggers still there and enabled
