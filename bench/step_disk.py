"""Disk per step report, as ingested and after compaction (issue 15, point 2).

A focused measurement beside the ingest benchmark's load: RANKS × STEPS step reports with
simulator-like values (every phase timed, sent at full float precision and stored to the
microsecond, a loss that decays with noise, a check every CHECK_EVERY steps) stored through
the runs service the ingest worker calls (`steps_store`, batches of BATCH_STEPS steps of
every rank), then compacted with the real compaction (`steps_compact`). Both figures are
pg_total_relation_size (table, TOAST, indexes) after VACUUM FULL, divided by the reports the
table holds.

Run by bench/ingest.py against its scratch database (DATABASE_URL in the environment);
alone: `DATABASE_URL=… python -m bench.step_disk` prints the figures as JSON.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from datetime import timedelta
from pathlib import Path

RANKS = 64
STEPS = 2000
BATCH_STEPS = 10
CHECK_EVERY = 100


def _report(rng: random.Random, rank: int, step: int, t: float) -> dict:
    data, h2d = 0.05 * (1 + 0.1 * rng.uniform(-1, 1)), 0.01 * (1 + 0.1 * rng.uniform(-1, 1))
    compute = 0.6 * (1 + 0.05 * rng.uniform(-1, 1))
    own = max(data + h2d + compute, 0.7) + 0.3 * (1 + 0.1 * rng.uniform(-1, 1))
    out = {
        "ts": t, "rank": rank, "step": step, "step_time": own, "data_time": data,
        "h2d_time": h2d, "compute_time": compute, "comm_wait": own - (data + h2d + compute),
        "tokens": 4096, "loss": (2 + 8 * math.exp(-step / 400)) * (1 + 0.02 * rng.uniform(-1, 1)),
        "shard": f"dp{rank % 8}", "gpu": rank % 8,
    }  # fmt: skip
    if step % CHECK_EVERY == 0:
        out["grad_checksum"] = f"{rng.getrandbits(256):064x}"
        out["param_checksum"] = f"{rng.getrandbits(256):064x}"
        out["canary"] = {"norm": 3.5 + rng.random(), "proj": [rng.random() for _ in range(4)]}
    return out


def measure() -> dict[str, float]:
    import django

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    django.setup()
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.clusters.models import Cluster, Node
    from apps.core.partitions import relation_bytes_sql
    from apps.runs.compaction import steps_compact
    from apps.runs.services import RunSeen, runs_touch, steps_store

    cluster = Cluster.objects.create(name="bench-steps")
    nodes = [Node.objects.create(cluster=cluster, name=f"sn{i:02d}").id for i in range(8)]
    rng = random.Random(15)
    start = timezone.now().timestamp() - 86400  # a day ago: every window is compactable
    for first in range(0, STEPS, BATCH_STEPS):
        batch = [
            _report(rng, rank, step, start + step + rank * 1e-4)
            for step in range(first, first + BATCH_STEPS)
            for rank in range(RANKS)
        ]
        seen = RunSeen()
        for step in batch:
            seen.add_step(step)
        with transaction.atomic():
            run_id = runs_touch(seen={(cluster.id, "bench-steps"): seen})[cluster.id, "bench-steps"]
            steps_store(steps=[(run_id, nodes[s["rank"] // 8], s) for s in batch])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM FULL runs_stepreport")
        cursor.execute(
            f"SELECT {relation_bytes_sql('runs_stepreport', holding_rows=True)}::float8"
            " / count(*), count(*) FROM runs_stepreport"
        )
        ingested, reports = cursor.fetchone()
    steps_compact(now=timezone.now() + timedelta(days=1), limit=100_000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM FULL runs_stepchunk")
        cursor.execute("VACUUM FULL runs_stepreport")
        cursor.execute(
            f"SELECT {relation_bytes_sql('runs_stepchunk', holding_rows=True)}::float8"
            " / sum(n), sum(n), (SELECT count(*) FROM runs_stepreport) FROM runs_stepchunk"
        )
        compacted, in_chunks, left_raw = cursor.fetchone()
    return {
        "reports": reports,
        "ingested": ingested,
        "compacted": compacted,
        "in_chunks": int(in_chunks),
        "left_raw": left_raw,
    }


def run_measurement(env: dict[str, str]) -> dict[str, float]:
    """measure() in a child process on the stack's environment (its scratch database)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench.step_disk"],
        cwd=root, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


# runs_stepreport's stored columns (no id, no index), with their binary COPY types
STEP_COLUMNS = (
    ("run_id", "int8"), ("node_id", "int8"), ("ts", "timestamptz"), ("rank", "int4"),
    ("step", "int8"), ("step_time", "float8"), ("data_time", "float8"),
    ("h2d_time", "float8"), ("compute_time", "float8"), ("comm_wait", "float8"),
    ("tokens", "int8"), ("loss", "float8"), ("grad_checksum", "text"),
    ("param_checksum", "text"), ("canary_norm", "float8"), ("canary_proj", "float8[]"),
    ("shard", "text"), ("gpu", "int2"),
)  # fmt: skip


def raw_copy_rate(
    conninfo: str, rows: list[tuple], columns: tuple[tuple[str, str], ...] = STEP_COLUMNS
) -> float:
    """Rows/s of a binary COPY of `rows` into a bare table of `columns` ((name, COPY type),
    in the rows' order; default STEP_COLUMNS), 1,000 rows per COPY and commit, one
    connection: the floor bench/ingest.py compares its samples and step reports with."""
    import time

    import psycopg

    definition = ", ".join(f"{name} {kind}" for name, kind in columns)
    with psycopg.connect(conninfo, application_name="bench client") as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw")
        conn.execute(f"CREATE TABLE bench_raw ({definition})")
        conn.commit()
        started = time.monotonic()
        for offset in range(0, len(rows), 1000):
            with (
                conn.cursor() as cursor,
                cursor.copy("COPY bench_raw FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types([kind for _, kind in columns])
                for row in rows[offset : offset + 1000]:
                    copy.write_row(row)
            conn.commit()
        elapsed = time.monotonic() - started
        conn.execute("DROP TABLE bench_raw")
        conn.commit()
    return len(rows) / elapsed


if __name__ == "__main__":
    print(json.dumps(measure()))
