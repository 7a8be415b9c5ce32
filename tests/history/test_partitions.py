"""The time tables' partitions: the migration of a populated database (rows, ids and files
kept, nothing rewritten), retention by dropping whole partitions, the way back, and
maintenance that never queues behind a lock it cannot have."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from apps.core.partitions import boundary_floor, partitions_list
from apps.history.services import partitions_maintain
from launcher.procs import ROOT
from tests.stackproc import database_url

TABLES = ("telemetry_chunk", "runs_stepreport", "runs_stepchunk", "history_step_1m")
DAY = 86400

# Ten days of each, up to now, written into the tables as they were before migration 0004
_SEED = [
    """INSERT INTO telemetry_chunk (t0, t1, vmin, vmax, vsum, node_id, metric_id, n, gpu,
         sealed, offsets_ms, vals)
       SELECT now() - make_interval(secs => i * 1800), now() - make_interval(secs => i * 1800 - 60),
         0, i, i, 1 + i % 20, 1, 2, 0, true, ARRAY[0, 60000], ARRAY[0, i]::float8[]
       FROM generate_series(1, 480) i""",
    """INSERT INTO runs_stepreport (run_id, node_id, ts, rank, step, step_time)
       SELECT 1, 1 + i % 4, now() - make_interval(secs => i * 17), i % 8, i, 0.5
       FROM generate_series(1, 50000) i""",
    """INSERT INTO runs_stepchunk (run_id, rank, "window", t0, t1, step_lo, step_hi, n, checked,
         data)
       SELECT 1, i % 8, w, w, w + interval '599 seconds', i, i, 1, 0, '\\x00'
       FROM generate_series(1, 1400) i,
         LATERAL (SELECT now() - make_interval(secs => i * 600) AS w) x""",
    """INSERT INTO history_step_1m (run_id, rank, bucket, n, max_step, step_time_sum,
         step_time_max, data_time_n, h2d_time_n, compute_time_n, comm_wait_n, loss_n)
       SELECT 1, i % 8, date_trunc('minute', now()) - make_interval(mins => i / 8), 1, i, 1, 1,
         0, 0, 0, 0, 0
       FROM generate_series(0, 9999) i""",
]


def table_state(conn: psycopg.Connection, table: str) -> tuple[int, str]:
    return conn.execute(
        f"SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), ''))"
        f" FROM {table} t"
    ).fetchone()


def manage(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def shell(url: str, code: str) -> object:
    return json.loads(manage(url, "shell", "-c", code).strip().splitlines()[-1])


@pytest.fixture
def scratch(db):
    """A database of its own on the session's server, dropped afterwards."""
    name = f"partmig_{uuid.uuid4().hex[:10]}"
    server = database_url(connection.settings_dict)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield database_url({**connection.settings_dict, "NAME": name})
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_a_populated_database_is_partitioned_in_place_kept_and_pruned_by_partitions(scratch):
    manage(scratch, "migrate", "history", "0003", "-v", "0")
    for app in ("runs", "telemetry"):  # the others as they are today; history before 0004
        manage(scratch, "migrate", app, "-v", "0")
    with psycopg.connect(scratch, autocommit=True) as conn:
        for statement in _SEED:
            conn.execute(statement)
        before = {t: table_state(conn, t) for t in TABLES}
        files = {
            t: conn.execute(f"SELECT pg_relation_filenode('{t}')").fetchone()[0] for t in TABLES
        }
        id_max = conn.execute("SELECT max(id) FROM runs_stepreport").fetchone()[0]

    began = time.perf_counter()
    manage(scratch, "migrate", "-v", "0")
    print(f"partitioned 61,880 rows in place: migration {time.perf_counter() - began:.1f} s")

    with psycopg.connect(scratch, autocommit=True) as conn:
        for table in TABLES:
            assert table_state(conn, table) == before[table], table
            # the old table is the legacy partition itself: same file, nothing copied
            legacy_file = conn.execute(f"SELECT pg_relation_filenode('{table}_legacy')").fetchone()
            assert legacy_file[0] == files[table], table
            partitions = partitions_list(conn.cursor(), table)
            names = [p.name for p in partitions]
            assert names[0] == f"{table}_legacy" and names[-1] == f"{table}_default"
            assert partitions[-2].hi >= timezone.now() + timedelta(days=7)  # a week made ahead
        # ids go on from where the identity left off; a row after the boundary has its own day
        tomorrow2 = timezone.now() + timedelta(days=2)
        row = conn.execute(
            "INSERT INTO runs_stepreport (run_id, node_id, ts, rank, step, step_time)"
            " VALUES (1, 1, %s, 0, 1, 0.5) RETURNING id, tableoid::regclass::text",
            [tomorrow2],
        ).fetchone()
        assert row == (id_max + 1, f"runs_stepreport_p{boundary_floor(tomorrow2, 1):%Y%m%d}")
        boundary = partitions_list(conn.cursor(), "runs_stepreport")[0].hi

    # Four days on (raw retention 7): the legacy rows older than the cutoff go by row deletes
    now = timezone.now() + timedelta(days=4)
    deleted = shell(scratch, _prune_code(now))
    with psycopg.connect(scratch, autocommit=True) as conn:
        cutoff = now - timedelta(days=7)
        old = conn.execute(
            "SELECT count(*) FROM runs_stepreport WHERE ts < %s", [cutoff]
        ).fetchone()
        assert old[0] == 0 and deleted["runs_stepreport"] > 0
        kept = conn.execute("SELECT count(*) FROM runs_stepreport").fetchone()[0]
    # Past the boundary's expiry: the legacy partition and the first day go whole
    now = boundary + timedelta(days=8, hours=1)
    shell(scratch, _prune_code(now))
    with psycopg.connect(scratch, autocommit=True) as conn:
        names = [p.name for p in partitions_list(conn.cursor(), "runs_stepreport")]
        assert "runs_stepreport_legacy" not in names
        assert f"runs_stepreport_p{boundary:%Y%m%d}" not in names
        left = conn.execute("SELECT count(*) FROM runs_stepreport").fetchone()[0]
        assert left == 1 and kept > left  # the row two days ahead, in a later partition

    # And back: one plain table per name again, its rows and identity as they were
    manage(scratch, "migrate", "history", "0003", "-v", "0")
    with psycopg.connect(scratch, autocommit=True) as conn:
        kinds = conn.execute(
            "SELECT relname, relkind FROM pg_class WHERE relname = ANY(%s)", [list(TABLES)]
        ).fetchall()
        assert sorted(kinds) == sorted((t, "r") for t in TABLES)
        assert conn.execute("SELECT count(*) FROM runs_stepreport").fetchone()[0] == 1
        new_id = conn.execute(
            "INSERT INTO runs_stepreport (run_id, node_id, ts, rank, step, step_time)"
            " VALUES (1, 1, now(), 0, 2, 0.5) RETURNING id"
        ).fetchone()[0]
        assert new_id == id_max + 2
    manage(scratch, "migrate", "-v", "0")  # and forwards again


def _prune_code(now) -> str:
    return (
        "import json, datetime; from apps.history.services import history_prune;"
        f" now = datetime.datetime.fromisoformat('{now.isoformat()}');"
        " print(json.dumps(history_prune(now=now)))"
    )


@pytest.mark.django_db(transaction=True)
def test_maintenance_waits_for_a_lock_only_so_long_and_makes_its_partitions_later(caplog):
    ahead = timezone.now() + timedelta(days=9)
    with psycopg.connect(
        database_url(connection.settings_dict)
    ) as reader:  # a long read holds the table
        reader.execute("SELECT 1 FROM runs_stepreport LIMIT 1")
        began = time.perf_counter()
        with override_settings(PARTITION_LOCK_TIMEOUT_MS=200), caplog.at_level(logging.WARNING):
            made = partitions_maintain(now=ahead)
        waited = time.perf_counter() - began
        reader.rollback()
    assert "runs_stepreport" not in made
    assert any("runs_stepreport not made" in r.getMessage() for r in caplog.records)
    assert waited < 1.5  # 200 ms for the refused lock, no queueing behind the reader
    made = partitions_maintain(now=ahead)
    expected = f"runs_stepreport_p{boundary_floor(ahead + timedelta(days=7), 1):%Y%m%d}"
    with connection.cursor() as cursor:
        names = [p.name for p in partitions_list(cursor, "runs_stepreport")]
    assert expected in names
    assert partitions_maintain(now=ahead) == {t: [] for t in made}  # nothing twice
