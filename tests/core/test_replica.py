"""Reads from a real streaming replica (apps/core/db_router.py, docs/scaling.md).

A throwaway primary (initdb in a temp dir, its own port on 127.0.0.1) and its replica
(pg_basebackup -R), the web server on both (DATABASE_URL, DATABASE_REPLICA_URL). With the
replica's replay paused, what the primary gets next is on the primary only: a page read
from the replica shows the old state, one read from the primary the new."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings

from launcher.commands import server_commands
from launcher.leftovers import processes_under
from launcher.procs import ROOT, free_port, http_ok, wait_until
from opsboard import embedded
from opsboard.embedded import postgres_stop
from opsboard.replica import primary_init, replica_clone, server_start
from tests.stackproc import LOG_DIR, Process

PASSWORD = "replica-test-password-1"
SETUP = f"""
from django.contrib.auth.models import User
from apps.access.models import ClusterRole
from apps.clusters.models import Cluster, Node
from apps.telemetry.models import Metric
Metric.objects.get_or_create(name="gpu.util")
user = User.objects.create_user("reader", password="{PASSWORD}")
for name in ("alpha", "beta"):
    cluster = Cluster.objects.create(name=name)
    ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
    Node.objects.create(cluster=cluster, name=f"{{name}}-node-old")
"""


@dataclass
class Pair:
    primary: str  # postgres:// URLs
    replica: str
    url: str = ""  # the web server's
    log: Path | None = None
    log_offset: int = 0

    def on_primary(self, sql: str, *args: object) -> None:
        with psycopg.connect(self.primary, autocommit=True) as conn:
            conn.execute(sql, args)

    def on_replica(self, sql: str) -> tuple:
        with psycopg.connect(self.replica, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
        assert row is not None
        return row

    def replica_catch_up(self) -> None:
        with psycopg.connect(self.primary, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        lsn = row[0]
        wait_until(
            lambda: self.on_replica(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0],
            10,
            "the replica to replay the primary's WAL",
        )


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, timeout=120)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    # A short path: the servers' sockets live in their data directories.
    base = Path(tempfile.mkdtemp(prefix="obrep-", dir="/tmp"))
    base.chmod(0o755)  # the servers' own user (under root) reaches its data directories
    primary_dir, replica_dir = base / "primary", base / "replica"
    primary_port, replica_port = free_port(), free_port()
    try:
        primary_init(primary_dir)
        server_start(
            data_dir=primary_dir, port=primary_port, listen="127.0.0.1", socket_dir=primary_dir
        )
        found = Pair(
            primary=f"postgres://postgres@127.0.0.1:{primary_port}/postgres",
            replica=f"postgres://postgres@127.0.0.1:{replica_port}/postgres",
        )
        env = {**os.environ, "DATABASE_URL": found.primary}
        env.pop("DATABASE_REPLICA_URL", None)
        _manage(env, "migrate", "--noinput", "-v", "0")
        _manage(env, "shell", "-c", SETUP)
        replica_clone(data_dir=replica_dir, host="127.0.0.1", port=primary_port)
        server_start(
            data_dir=replica_dir, port=replica_port, listen="127.0.0.1", socket_dir=replica_dir
        )
        yield found
    finally:
        postgres_stop(replica_dir)
        postgres_stop(primary_dir)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def web(pair: Pair) -> Iterator[Pair]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": pair.primary,
        "DATABASE_REPLICA_URL": pair.replica,
        "REDIS_URL": settings.REDIS_URL,
        "OPSBOARD_REDIS_PREFIX": settings.REDIS_PREFIX,
        "DEBUG": "true",
        "AXES_ENABLED": "false",
    }
    command = server_commands(
        host="127.0.0.1", port=port, ws_port=free_port(), web_workers=1,
        worker_concurrency=1, queue=settings.REDIS_PREFIX, beat_schedule=LOG_DIR / "x",
    )["web"]  # fmt: skip
    server = Process("replica-web", command, env)
    server.start()
    pair.url, pair.log = f"http://127.0.0.1:{port}", LOG_DIR / "replica-web.log"
    offset = pair.log.stat().st_size if pair.log.exists() else 0
    pair.log_offset = offset
    try:
        wait_until(lambda: http_ok(f"{pair.url}/healthz"), 60, "the web server")
        yield pair
    finally:
        server.stop()


def _logged_in(pair: Pair) -> httpx.Client:
    client = httpx.Client(base_url=pair.url, timeout=15)
    client.get("/accounts/login/")
    answer = client.post(
        "/accounts/login/",
        data={
            "username": "reader",
            "password": PASSWORD,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert answer.status_code == 302, answer.text[:300]
    return client


def _without_sticky(client: httpx.Client, pair: Pair) -> httpx.Client:
    """The same session from a client whose write is older than the sticky window."""
    other = httpx.Client(base_url=pair.url, timeout=15)
    for name in ("sessionid", "csrftoken"):
        other.cookies.set(name, client.cookies[name], domain="127.0.0.1")
    return other


def test_it_reads_pages_from_the_replica_and_a_writer_from_the_primary(web: Pair) -> None:
    started = time.monotonic()
    writer = _logged_in(web)  # its login POST made it sticky to the primary
    assert "opsboard_primary" in writer.cookies
    reader = _without_sticky(writer, web)
    web.replica_catch_up()
    assert reader.get("/clusters/alpha/").status_code == 200
    web.on_replica("SELECT pg_wal_replay_pause()::text")
    web.on_primary(
        "INSERT INTO clusters_node (cluster_id, name, info, state, has_agent, down_by,"
        " cordon_reason) SELECT id, 'alpha-node-new', '{}', 'active', true, '', ''"
        " FROM clusters_cluster WHERE name = 'alpha'"
    )
    web.on_primary(
        "INSERT INTO telemetry_nodehealth (node_id, gpu, ts, values) SELECT id, -1, now(),"
        """ '{"gpu.util": 50}' FROM clusters_node WHERE name = 'alpha-node-old'"""
    )
    time.sleep(0.3)  # the WAL reaches the replica, which holds it unreplayed

    # (a) the page and the list API read the replica: the new node is not there yet
    page = reader.get("/clusters/alpha/")
    assert page.status_code == 200 and "alpha-node-old" in page.text
    assert "alpha-node-new" not in page.text
    series = reader.get("/api/v1/nodes/alpha-node-new/series", params={"cluster": "alpha"})
    assert series.status_code == 404, series.text
    # ... the selectors' own SQL too: the series is not known there yet
    known = {"node": "alpha-node-old", "metric": "gpu.util", "cluster": "alpha"}
    assert reader.get("/api/v1/series", params=known).status_code == 404
    # ... while the client that just wrote reads the primary, and sees it
    assert writer.get("/api/v1/series", params=known).status_code == 200
    assert "alpha-node-new" in writer.get("/clusters/alpha/").text
    fresh = writer.get("/api/v1/nodes/alpha-node-new/series", params={"cluster": "alpha"})
    assert fresh.status_code == 200, fresh.text
    # a client that POSTs reads the primary from then on (its redirect's page, PRG)
    token = {"X-CSRFToken": reader.cookies["csrftoken"]}
    assert reader.post("/alerts/999999/ack", headers=token).status_code == 404
    assert "alpha-node-new" in reader.get("/clusters/alpha/").text

    # (b) a role revoked on the primary takes effect at once, whatever the replica's lag
    assert web.on_replica("SELECT pg_is_wal_replay_paused()")[0]
    assert _without_sticky(writer, web).get("/clusters/beta/").status_code == 200
    web.on_primary(
        "DELETE FROM access_clusterrole WHERE cluster_id ="
        " (SELECT id FROM clusters_cluster WHERE name = 'beta')"
    )
    stale = _without_sticky(writer, web)
    assert stale.get("/clusters/beta/").status_code == 404
    alerts = stale.get("/api/v1/alerts", params={"cluster": "beta"})
    assert alerts.status_code == 404, alerts.text
    assert stale.get("/clusters/alpha/").status_code == 200  # the rest still served
    assert web.on_replica("SELECT count(*) FROM access_clusterrole")[0] == 2  # still stale

    web.on_replica("SELECT pg_wal_replay_resume()::text")
    web.replica_catch_up()
    assert "alpha-node-new" in stale.get("/clusters/alpha/").text
    # (c) no write went to the replica: Postgres would refuse it, and the page answer 500
    assert web.log is not None
    logged = web.log.read_text(errors="replace")[web.log_offset :]
    assert "read-only transaction" not in logged and "Traceback" not in logged
    assert time.monotonic() - started < 30


IN_RECOVERY = (
    "from django.db import connections\n"
    "with connections['replica'].cursor() as cursor:\n"
    "    cursor.execute('SELECT pg_is_in_recovery()')\n"
    "    print('replica in recovery:', cursor.fetchone()[0])\n"
)


def test_the_embedded_default_runs_a_replica_and_stops_it_with_the_rest(monkeypatch) -> None:
    # Not under pytest's tmp_path: another pytest session of this user makes its parent
    # private again at its start, and the servers' own user (under root) must reach it.
    base = Path(tempfile.mkdtemp(prefix="obemb-", dir="/tmp"))
    base.chmod(0o755)
    var = base / "var"
    monkeypatch.setenv("OPSBOARD_VAR_DIR", str(var))
    env = {**os.environ, "OPSBOARD_EMBEDDED_REPLICA": "1"}
    for name in ("DATABASE_URL", "DATABASE_REPLICA_URL"):
        env.pop(name, None)
    try:
        shell = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", IN_RECOVERY],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert "replica in recovery: True" in shell.stdout, shell.stderr[-2000:]
        assert embedded.servers_running() >= {"postgres", "replica"}
    finally:
        embedded.stop(embedded.servers_running())  # as launcher.testrun does
    try:
        assert processes_under(var) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
