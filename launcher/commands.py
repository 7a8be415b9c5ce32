"""The stack's long-running processes as commands (`server_commands`), shared by the
launcher (`make run`, `make demo`), the tests' stacks, the benchmarks and the evaluation."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def server_commands(
    *,
    host: str,
    port: int,
    ws_port: int,
    web_workers: int,
    worker_concurrency: int,
    queue: str,
    beat_schedule: Path,
    beat_in_worker: bool = False,
    periodic_concurrency: int = 2,
    log_level: str = "INFO",
    ingest_port: int | None = None,
    ingest_workers: int = 3,
    ingest_nice: int = 0,
    ingest_sched_idle: bool = False,
    ingest_group: Path | None = None,
) -> dict[str, list[str]]:
    """The stack's long-running processes.

    HTTP (the agent API and the pages) is served by gunicorn's WSGI workers and websockets by
    uvicorn: a 1,000-sample ingest measured ≈ 2× the throughput under WSGI (bench/ingest.py),
    as Django runs each ASGI request's sync view through a thread hop of its own.

    Two Celery workers: `worker` drains ingest from `queue`, `periodic` runs beat's tasks
    (evaluation, rollups, pruning, compaction, the inbox sweep) from `<queue>.periodic`
    (settings.CELERY_PERIODIC_QUEUE), so an ingest backlog never delays detection.
    `beat_in_worker` embeds beat in the periodic worker (one process fewer). `log_level` is
    Celery's (the launcher passes LOG_LEVEL, WARNING by default; the tests keep INFO).

    With `ingest_port`, agents' POSTs get gunicorn workers of their own there (`ingest`, the
    endpoint alone: settings' OPSBOARD_ROLE), as a proxy routes them in production
    (docker/nginx.conf): a page or chart read never queues behind ingest bodies.

    `ingest_nice` > 0 runs the ingest worker (and the ingest pool, when it has one) at that
    niceness: when the cores are saturated, page reads, detection and the live feed get the
    CPU first, and the excess waits durably in the inbox and the agents' spools (chart p95
    under ingest ÷ idle 4.5–7.4 → 2.2–3.1 in bench/ingest.py, docs/performance-history.md). Their
    Postgres backends follow, and so does the database work of the maintenance passes, when the
    server is local (the INGEST_NICE setting, apps/core/db_nice.py).

    `ingest_sched_idle` (Linux, with util-linux's `chrt`) runs them under SCHED_IDLE too. A
    niced task still keeps the CPU for the rest of its time slice when a page read wakes up
    (about 1.5 ms on two cores), and a chart request wakes up a dozen times (Django, then
    Postgres, per query): an idle-class task gives way at once. Chart p95 under ingest ÷
    idle, median of 8 and 6 runs: 2.18 → 1.56, at the same ingest rate (docs/performance-history.md,
    "The sixth round"). The cost: on a host whose other work keeps every core busy, ingest
    waits for a free core (the backlog then waits durably in the inbox and the spools).

    `ingest_group` (launcher.cpu_group.idle_group_create) runs them in that idle cpu cgroup
    as well: the class orders the tasks of one scheduling group only, and Postgres and the
    stack are groups of their own (autogroup, a cgroup per service). Chart p95 under ingest
    ÷ idle 1.5–2.3 → 1.1–1.3 (docs/performance-history.md, "The seventh round")."""
    python = sys.executable
    # Below INFO, the start-up banners go too (they came after the printed login).
    quiet = [] if log_level.upper() in ("DEBUG", "INFO") else ["--quiet"]

    def celery_worker(queues: str, concurrency: int, *extra: str) -> list[str]:
        return [
            python,
            "-m",
            "celery",
            *quiet,
            "-A",
            "opsboard",
            "worker",
            "--loglevel",
            log_level,
            "--concurrency",
            str(concurrency),
            "--without-mingle",
            "--without-gossip",
            "-Q",
            queues,
            *extra,
        ]

    worker = celery_worker(queue, worker_concurrency)
    # its own node name: two workers of one host must not share one
    periodic = celery_worker(
        f"{queue}.periodic", periodic_concurrency, "-n", f"periodic.{queue}@%h"
    )
    beat = ["--schedule", str(beat_schedule)]

    def gunicorn(bind_port: int, workers: int) -> list[str]:
        return [
            python,
            "-m",
            "gunicorn",
            "opsboard.wsgi:application",
            "--bind",
            f"{host}:{bind_port}",
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]

    commands = {
        "web": gunicorn(port, web_workers),
        "ws": [
            python,
            "-m",
            "uvicorn",
            "opsboard.asgi:application",
            "--host",
            host,
            "--port",
            str(ws_port),
            "--no-access-log",
            # the client address is apps.core.client_ip's to work out (TRUSTED_PROXIES):
            # uvicorn would otherwise take X-Forwarded-For from any loopback peer as fact
            "--no-proxy-headers",
            "--log-level",
            "warning",
        ],
        "worker": worker,
        "periodic": [*periodic, "-B", *beat] if beat_in_worker else periodic,
        "publisher": [python, "manage.py", "live_publisher"],
    }
    if ingest_port is not None:
        commands["ingest"] = [*gunicorn(ingest_port, ingest_workers), "--env", ROLE_INGEST]
    lowered = ["nice", "-n", str(ingest_nice)] if ingest_nice > 0 else []
    if ingest_sched_idle and sched_idle_available():
        lowered = ["chrt", "--idle", "0", *lowered]
    if ingest_group is not None:
        lowered = [python, "-m", "launcher.cpu_group", str(ingest_group), "--", *lowered]
    for role in ("ingest", "worker"):
        if role in commands:
            commands[role] = [*lowered, *commands[role]]
    if not beat_in_worker:
        commands["beat"] = [
            python,
            "-m",
            "celery",
            *quiet,
            "-A",
            "opsboard",
            "beat",
            "--loglevel",
            log_level,
            *beat,
        ]
    return commands


ROLE_INGEST = "OPSBOARD_ROLE=ingest"  # the pages' middleware is not the ingest pool's


def sched_idle_available() -> bool:
    """True where the ingest processes can run under SCHED_IDLE (Linux, `chrt` installed)."""
    return hasattr(os, "SCHED_IDLE") and shutil.which("chrt") is not None
