"""A niced process's Postgres backends run at its niceness (apps/core/db_nice.py), over TCP
and over a Unix socket; an un-niced process leaves them alone; the identity check refuses a
pid that is no backend of the server at the other end of the socket (over TCP: no backend of
this very connection). The maintenance passes run their database work niced, on a backend
dropped after them, and change nothing inside a transaction."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from apps.core.db_nice import backend_is_ours, background_db

ROOT = Path(__file__).resolve().parent.parent

# In a child process: connect through Django, print the backend's pid and niceness.
CHILD = """
import os, django
django.setup()
from django.db import connection
connection.ensure_connection()
pid = connection.connection.info.backend_pid
print(pid, os.getpriority(os.PRIO_PROCESS, pid))
"""


def socket_dir() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW unix_socket_directories")
        return cursor.fetchone()[0].split(",")[0].strip()


def database_urls() -> dict[str, str]:
    db = connection.settings_dict
    name, user = db["NAME"], db["USER"] or "postgres"
    return {
        "tcp": f"postgres://{user}@127.0.0.1:{db['PORT'] or 5432}/{name}",
        "unix": f"postgres://{user}@{quote(socket_dir(), safe='')}:{db['PORT'] or 5432}/{name}",
    }


def child_backend(url: str, niceness: int) -> tuple[int, int]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "opsboard.settings"}
    command = [sys.executable, "-c", CHILD]
    if niceness:
        command = ["nice", "-n", str(niceness), *command]
    result = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    pid, backend_niceness = result.stdout.split()
    return int(pid), int(backend_niceness)


@pytest.mark.django_db
@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_a_niced_process_renices_its_own_backend(via):
    url = database_urls()[via]
    assert child_backend(url, niceness=7)[1] == 7
    assert child_backend(url, niceness=0)[1] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_a_pid_is_taken_only_for_a_backend_at_the_other_end_of_the_socket(via):
    db = connection.settings_dict
    host = "127.0.0.1" if via == "tcp" else socket_dir()
    params = {"host": host, "port": db["PORT"] or 5432, "user": db["USER"] or "postgres"}
    with (
        psycopg.connect(dbname=db["NAME"], **params) as one,
        psycopg.connect(dbname=db["NAME"], **params) as other,
    ):
        mine, theirs = one.info.backend_pid, other.info.backend_pid
        assert backend_is_ours(fileno=one.fileno(), backend_pid=mine)
        assert not backend_is_ours(fileno=one.fileno(), backend_pid=os.getpid())
        # over TCP the title names the client's port; over a Unix socket any backend of that
        # server is in this pid namespace, which is what the check is for
        assert backend_is_ours(fileno=one.fileno(), backend_pid=theirs) == (via == "unix")


def backend_niceness() -> tuple[int, int]:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    return pid, os.getpriority(os.PRIO_PROCESS, pid)


def test_maintenance_runs_its_database_work_niced_then_drops_the_backend(
    transactional_db, settings
):
    settings.INGEST_NICE = 6
    before, niceness = backend_niceness()
    assert niceness == 0
    with background_db():
        assert backend_niceness() == (before, 6)
    after, niceness = backend_niceness()
    assert after != before and niceness == 0  # detection, next, gets a backend at 0


@pytest.mark.django_db
def test_maintenance_called_inside_a_transaction_changes_nothing(settings):
    settings.INGEST_NICE = 6
    before = backend_niceness()
    with background_db():
        assert backend_niceness() == before
    assert backend_niceness() == before
