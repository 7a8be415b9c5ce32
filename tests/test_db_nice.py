"""A niced process's Postgres backends run at its niceness (apps/core/db_nice.py), over TCP
and over a Unix socket, and an idle-class process's in the idle class; an un-niced process
leaves them alone; the launcher puts the ingest worker, and nothing else, in the idle class.
The identity check refuses a pid that is no backend of the server at the other end of the
socket (over TCP: no backend of this very connection). The maintenance passes run their
database work niced, on a backend dropped after them, and change nothing inside a
transaction."""

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from apps.core.db_nice import backend_is_ours, background_db
from launcher.commands import sched_idle_available
from launcher.cpu_group import group_is_idle, idle_group_create, idle_group_remove, own_cpu_group
from launcher.stack import ingest_group_prepare, processes

ROOT = Path(__file__).resolve().parent.parent

# In a child process: connect through Django, print the backend's pid and niceness.
CHILD = """
import os, django
django.setup()
from django.conf import settings
from django.db import connection
connection.ensure_connection()
pid = connection.connection.info.backend_pid
print(pid, os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid))
"""


def server_transports() -> dict[str, dict]:
    """How this session's database server can be reached, as psycopg connection parameters
    by transport: "tcp" at the host and port the session itself uses (or, when the session
    uses a Unix socket, the server's own listen address, if it listens on TCP at all), and
    "unix" at the server's socket, if that socket is on this machine. The embedded Postgres
    listens on its socket only; the machine's own listens on both. Asked of the server at
    collection time, before the test database exists, on the database the settings name."""
    db = settings.DATABASES["default"]
    session_host = db["HOST"] or "127.0.0.1"
    with _server_connection(session_host, db) as conn:
        listen, port, sockets = (
            conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("listen_addresses", "port", "unix_socket_directories")
        )
    transports = {}
    if not session_host.startswith("/"):
        transports["tcp"] = {"host": session_host, "port": db["PORT"] or 5432}
    elif listen.strip():
        address = listen.split(",")[0].strip()
        loopback = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
        transports["tcp"] = {"host": loopback.get(address, address), "port": int(port)}
    socket_dir = sockets.split(",")[0].strip()
    if socket_dir and Path(socket_dir, f".s.PGSQL.{port}").exists():
        transports["unix"] = {"host": socket_dir, "port": int(port)}
    return transports


def _server_connection(host: str, db: dict) -> psycopg.Connection:
    """A connection to the session's server: to the database the settings name, or, as
    Django does when it makes the test database, to `postgres` when that one does not exist
    (pytest-django needs only the server)."""
    params = {"host": host, "port": db["PORT"] or 5432, "user": db["USER"] or "postgres"}
    try:
        return psycopg.connect(dbname=db["NAME"], **params)
    except psycopg.OperationalError:
        return psycopg.connect(dbname="postgres", **params)


def pytest_generate_tests(metafunc):
    if "via" in metafunc.fixturenames:
        metafunc.parametrize("via", sorted(server_transports()))


def database_urls() -> dict[str, str]:
    """The test database's URL by transport (the test database's name is known only once
    the session has made it)."""
    db = connection.settings_dict
    name, user = db["NAME"], db["USER"] or "postgres"
    return {
        via: f"postgres://{user}@{quote(params['host'], safe='')}:{params['port']}/{name}"
        for via, params in server_transports().items()
    }


def child_env(url: str, **extra: str) -> dict[str, str]:
    """A child's environment: the database at `url`, backends following (DB_BACKEND_NICE,
    opt-in; the launcher turns it on for the embedded Postgres)."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "opsboard.settings"}
    env.pop("INGEST_IDLE_GROUP_PATH", None)
    return {**env, "DB_BACKEND_NICE": "true", **extra}


def child_backend(
    url: str, niceness: int, prefix: Sequence[str] = (), *, follow: str = "true"
) -> tuple[int, int, int]:
    """(pid, niceness, scheduling policy) of the backend of a child started with `prefix`
    (the launcher's wrapping) at `niceness`."""
    env = child_env(url, DB_BACKEND_NICE=follow)
    command = [sys.executable, "-c", CHILD]
    if niceness:
        command = ["nice", "-n", str(niceness), *command]
    result = subprocess.run(
        [*prefix, *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pid, backend_niceness, policy = map(int, result.stdout.split())
    return pid, backend_niceness, policy


@pytest.mark.django_db
def test_a_niced_process_renices_its_own_backend(via):
    url = database_urls()[via]
    assert child_backend(url, niceness=7)[1:] == (7, os.SCHED_OTHER)
    assert child_backend(url, niceness=0)[1:] == (0, os.SCHED_OTHER)


@pytest.mark.django_db
def test_backends_keep_the_servers_priority_unless_following_is_chosen(via):
    """Opt-in: the backends are the database server's processes, not Opsboard's."""
    url = database_urls()[via]
    assert child_backend(url, niceness=7, follow="false")[1:] == (0, os.SCHED_OTHER)
    env = child_env(url)
    env.pop("DB_BACKEND_NICE")
    done = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-c", CHILD],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.split()[1:] == ["0", str(os.SCHED_OTHER)]  # the default: off
    # the launcher turns it on for the embedded Postgres: tests/test_embedded_default.py


@pytest.mark.django_db
def test_an_idle_class_process_moves_its_own_backend_to_the_idle_class(via):
    url = database_urls()[via]
    assert sched_idle_available(), "Linux with util-linux's chrt: the ingest processes need it"
    idle = ["chrt", "--idle", "0"]
    assert child_backend(url, niceness=10, prefix=idle)[1:] == (10, os.SCHED_IDLE)
    # with no niceness at all, the class alone is followed
    assert child_backend(url, niceness=0, prefix=idle)[1:] == (0, os.SCHED_IDLE)


def test_the_launcher_runs_ingest_and_only_ingest_in_the_idle_class():
    args = argparse.Namespace(
        command="run", host="127.0.0.1", port=1, ws_port=2, web_workers=1, worker_concurrency=1
    )
    environment = {"LOG_LEVEL": "WARNING", "OPSBOARD_VAR_DIR": "/nonexistent"}
    commands = processes(environment, args)
    assert commands["worker"][:6] == ["chrt", "--idle", "0", "nice", "-n", "10"]
    for role in ("web", "ws", "periodic", "publisher"):
        assert commands[role][0] == sys.executable, role  # pages, detection, live: normal
    off = processes({**environment, "INGEST_SCHED_IDLE": "false"}, args)
    assert off["worker"][:3] == ["nice", "-n", "10"]
    # the wrapped command runs, and in the idle class
    probe = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]
    done = subprocess.run([*commands["worker"][:3], *probe], capture_output=True, text=True)
    assert int(done.stdout) == os.SCHED_IDLE


@pytest.mark.django_db
def test_a_pid_is_taken_only_for_a_backend_at_the_other_end_of_the_socket(via):
    db = connection.settings_dict
    params = {**server_transports()[via], "user": db["USER"] or "postgres"}
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


def backend_priority() -> tuple[int, int, int]:
    """(pid, niceness, scheduling policy) of this test's own backend."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    return pid, os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid)


@pytest.mark.parametrize("idle", [False, True], ids=["niced", "niced-and-idle"])
def test_maintenance_runs_its_database_work_at_ingest_priority_then_drops_the_backend(
    transactional_db, settings, idle, caplog
):
    settings.INGEST_NICE, settings.INGEST_SCHED_IDLE = 6, idle
    settings.DB_BACKEND_NICE = True
    before, niceness, policy = backend_priority()
    assert (niceness, policy) == (0, os.SCHED_OTHER)
    with background_db():
        assert backend_priority() == (before, 6, os.SCHED_IDLE if idle else os.SCHED_OTHER)
    after, niceness, policy = backend_priority()
    # detection, next, gets a backend at the server's priority
    assert after != before and (niceness, policy) == (0, os.SCHED_OTHER)
    # dropped on purpose: the pool's warning for connections that died is not raised
    assert settings.DATABASES["default"]["OPTIONS"].get("pool")
    assert not [r for r in caplog.records if "discarding closed connection" in r.getMessage()]


@pytest.mark.django_db
def test_maintenance_called_inside_a_transaction_changes_nothing(settings):
    settings.INGEST_NICE, settings.INGEST_SCHED_IDLE = 6, True
    settings.DB_BACKEND_NICE = True
    before = backend_priority()
    with background_db():
        assert backend_priority() == before
    assert backend_priority() == before


# --- the idle cpu cgroup (launcher/cpu_group.py, INGEST_IDLE_GROUP) --------------------------

# In a child process: connect through Django, print its own and its backend's cpu cgroup.
CHILD_GROUP = """
import django
django.setup()
from django.conf import settings
from django.db import connection
from launcher.cpu_group import own_cpu_group
connection.ensure_connection()
print(own_cpu_group(), own_cpu_group(connection.connection.info.backend_pid))
"""


@pytest.fixture
def idle_group():
    """A new idle cpu cgroup, as the launcher makes one (root: cgroup v1, or a delegated v2
    subtree). CI runs as root; elsewhere, without permission, these tests skip."""
    group = idle_group_create()
    if group is None:
        message = "no writable cpu cgroup here (root, or a delegated cgroup v2 subtree)"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the idle group tests, but {message}")
        pytest.skip(message)
    assert group_is_idle(group) and own_cpu_group() != group
    yield group
    assert idle_group_remove(group), f"{group} still holds a process"


def groups_of_child(url: str, prefix: Sequence[str], group: Path) -> tuple[str, str]:
    """A child's own cpu cgroup and its backend's, the launcher naming `group` to it."""
    env = child_env(url, INGEST_IDLE_GROUP_PATH=str(group))
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD_GROUP],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    own, backend = done.stdout.split()
    return own, backend


@pytest.mark.django_db
def test_a_process_in_an_idle_group_moves_its_own_backend_into_it(via, idle_group):
    url = database_urls()[via]
    wrapped = [sys.executable, "-m", "launcher.cpu_group", str(idle_group), "--"]
    assert groups_of_child(url, wrapped, idle_group) == (str(idle_group), str(idle_group))
    # a process outside it (though the group is named to it) leaves its backend where the
    # server put it
    own, backend = groups_of_child(url, [], idle_group)
    assert idle_group not in (Path(own), Path(backend))


def test_the_launcher_runs_ingest_and_only_ingest_in_its_idle_group(idle_group):
    args = argparse.Namespace(
        command="run", host="127.0.0.1", port=1, ws_port=2, web_workers=1, worker_concurrency=1
    )
    environment = {"LOG_LEVEL": "WARNING", "OPSBOARD_VAR_DIR": "/nonexistent"}
    commands = processes(environment, args, ingest_group=idle_group)
    wrapper = [sys.executable, "-m", "launcher.cpu_group", str(idle_group), "--"]
    assert commands["worker"][:11] == [*wrapper, "chrt", "--idle", "0", "nice", "-n", "10"]
    for role in ("web", "ws", "periodic", "publisher"):
        assert str(idle_group) not in commands[role], role
    probe = [sys.executable, "-c", "from launcher.cpu_group import *; print(own_cpu_group())"]
    done = subprocess.run([*commands["worker"][:11], *probe], capture_output=True, text=True)
    assert done.stdout.strip() == str(idle_group)
    # the launcher names the group to every child (the maintenance passes use it); off: none
    env: dict[str, str] = {}
    made = ingest_group_prepare(env)
    assert made is not None and env["INGEST_IDLE_GROUP_PATH"] == str(made)
    assert group_is_idle(made) and idle_group_remove(made)
    env = {"INGEST_IDLE_GROUP": "false"}
    assert ingest_group_prepare(env) is None and "INGEST_IDLE_GROUP_PATH" not in env


def test_maintenance_backends_join_the_idle_group_then_are_dropped(
    transactional_db, settings, idle_group
):
    settings.INGEST_NICE, settings.INGEST_SCHED_IDLE = 0, False
    settings.INGEST_IDLE_GROUP_PATH, settings.DB_BACKEND_NICE = str(idle_group), True
    before = backend_priority()[0]
    assert own_cpu_group(before) != idle_group
    with background_db():
        assert backend_priority()[0] == before and own_cpu_group(before) == idle_group
    after = backend_priority()[0]
    assert after != before and own_cpu_group(after) != idle_group
