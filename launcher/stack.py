"""Start the whole stack in the foreground: `python -m launcher.stack run|demo`.

Resolves Postgres and Redis (DATABASE_URL / REDIS_URL, or the embedded default under
./var/), migrates, collects static files, then runs gunicorn for HTTP (127.0.0.1:8000),
uvicorn for websockets and agents' held command polls (8001), a Celery worker for ingest,
another for beat's periodic tasks, Celery beat, the live publisher and, for `demo`, the
cluster simulator posting through the real agent code. Children that exit are restarted
(as a supervisor would); Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.procs import ROOT, children_stop, wait_for_http

MAX_RESTARTS_PER_MINUTE = 5


def service_env() -> tuple[dict[str, str], bool]:
    """The environment for the children, with both URLs set; True if embedded was started."""
    environment = dict(os.environ)
    embedded = False
    if not environment.get("DATABASE_URL"):
        from opsboard.embedded import database_url

        environment["DATABASE_URL"] = database_url()
        embedded = True
    if not environment.get("REDIS_URL"):
        from opsboard.embedded import redis_url

        environment["REDIS_URL"] = redis_url()
        embedded = True
    # Served on loopback over plain HTTP: secure-cookie and HTTPS redirects stay off unless set.
    for name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        environment.setdefault(name, "false")
    return environment, embedded


# The demo's history is kept for hours, not days (each can still be set in the environment):
# its 64 GPUs write ~10 MB a minute before compaction, ~70 MB an hour after it.
DEMO_RETENTION_DAYS = {
    "HISTORY_RAW_RETENTION_DAYS": 6 / 24,
    "HISTORY_10S_RETENTION_DAYS": 6 / 24,
    "HISTORY_1M_RETENTION_DAYS": 1,
    "HISTORY_10M_RETENTION_DAYS": 1,
    "HISTORY_1H_RETENTION_DAYS": 1,
}


def stack_environment(command: str) -> tuple[dict[str, str], bool]:
    """service_env() with the launcher's defaults: warnings-only logs and, for `demo`, its
    short retention. True if embedded was started."""
    environment, embedded = service_env()
    # Warnings and errors only (Django's root logger, Celery): at INFO every ingest task logs
    # two lines, ~100 a second in the demo, and the printed login scrolls away.
    environment.setdefault("LOG_LEVEL", "WARNING")
    if command == "demo":
        for name, days in DEMO_RETENTION_DAYS.items():
            environment.setdefault(name, str(days))
    return environment, embedded


def manage(environment: dict[str, str], *args: str, capture: bool = False) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environment,
        check=True,
        stdout=subprocess.PIPE if capture else None,
        text=True,
    )
    return done.stdout or ""


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

    With `ingest_port`, agents' POSTs get gunicorn workers of their own there (`ingest`), as
    a proxy routes them in production (docker/nginx.conf): a page or chart read then never
    waits in the accept queue behind ingest bodies (docs/performance.md).

    `ingest_nice` > 0 runs the ingest worker (and the ingest pool, when it has one) at that
    niceness: when the cores are saturated, page reads, detection and the live feed get the
    CPU first, and the excess waits durably in the inbox and the agents' spools (chart p95
    under ingest ÷ idle 4.5–7.4 → 2.2–3.1 in bench/ingest.py, docs/performance.md). Their
    Postgres backends follow, and so does the database work of the maintenance passes, when the
    server is local (the INGEST_NICE setting, apps/core/db_nice.py).

    `ingest_sched_idle` (Linux, with util-linux's `chrt`) runs them under SCHED_IDLE too. A
    niced task still keeps the CPU for the rest of its time slice when a page read wakes up
    (about 1.5 ms on two cores), and a chart request wakes up a dozen times (Django, then
    Postgres, per query): an idle-class task gives way at once. Chart p95 under ingest ÷
    idle, median of 8 and 6 runs: 2.18 → 1.56, at the same ingest rate (docs/performance.md,
    "The sixth round"). The cost: on a host whose other work keeps every core busy, ingest
    waits for a free core (the backlog then waits durably in the inbox and the spools)."""
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
            "--log-level",
            "warning",
        ],
        "worker": worker,
        "periodic": [*periodic, "-B", *beat] if beat_in_worker else periodic,
        "publisher": [python, "manage.py", "live_publisher"],
    }
    if ingest_port is not None:
        commands["ingest"] = gunicorn(ingest_port, ingest_workers)
    lowered = ["nice", "-n", str(ingest_nice)] if ingest_nice > 0 else []
    if ingest_sched_idle and sched_idle_available():
        lowered = ["chrt", "--idle", "0", *lowered]
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


def sched_idle_available() -> bool:
    """True where the ingest processes can run under SCHED_IDLE (Linux, `chrt` installed)."""
    return hasattr(os, "SCHED_IDLE") and shutil.which("chrt") is not None


def processes(environment: dict[str, str], args: argparse.Namespace) -> dict[str, list[str]]:
    from opsboard.env import truthy

    var = Path(environment.get("OPSBOARD_VAR_DIR", ROOT / "var")).resolve()
    commands = server_commands(
        host=args.host,
        port=args.port,
        ws_port=args.ws_port,
        web_workers=args.web_workers,
        worker_concurrency=args.worker_concurrency,
        periodic_concurrency=int(environment.get("PERIODIC_WORKER_CONCURRENCY", 2)),
        queue=environment.get("OPSBOARD_REDIS_PREFIX", "opsboard"),
        beat_schedule=var / "celerybeat-schedule",
        log_level=environment["LOG_LEVEL"],
        ingest_nice=int(environment.get("INGEST_NICE", 10)),
        ingest_sched_idle=truthy(environment.get("INGEST_SCHED_IDLE", "true")),
    )
    if args.command == "demo":
        commands["simulator"] = simulator_command(
            server=f"http://{args.host}:{args.port}",
            token_file=demo_token(environment, var),
            spool_dir=var / "demo-spool",
        )
    return commands


def demo_token(environment: dict[str, str], var: Path) -> Path:
    """A new agent token of the `demo` cluster, in a file only this user reads."""
    token_file = var / "demo-token"
    token_file.write_text(
        manage(environment, "issue_token", "demo", "--name", "simulator", capture=True).strip()
    )
    token_file.chmod(0o600)
    return token_file


# The demo's faults, in simulated seconds from its start (= wall seconds: --speed 1). The
# README's "What the demo shows" says where each one appears; keep the two in step.
DEMO_FAULTS = (
    "straggler:rank=13,at=120,factor=1.35",  # run 0: rank 13 (demo-node-01, GPU 5)
    "xid:node=5,gpu=3,at=300,code=79",  # demo-node-05 GPU 3 falls off the bus
    "thermal:node=6,gpu=2,at=480,temp=92,ramp=60",  # run 1: GPU throttles, its rank slows
    "sdc:run=1,rank=20,mode=param,at=660",  # run 1: rank 20's parameters diverge
)


def simulator_command(*, server: str, token_file: Path, spool_dir: Path) -> list[str]:
    """The cluster simulator (real agent code) feeding a demo cluster in real time: 8 nodes
    × 8 GPUs, two runs of 32 ranks, DEMO_FAULTS over its first 12 minutes, with the
    simulator's noise model on (10 % per-step jitter, rare spikes)."""
    faults = [argument for fault in DEMO_FAULTS for argument in ("--fault", fault)]
    return [
        sys.executable,
        "-m",
        "opsboard_agent.sim",
        "--server",
        server,
        "--token-file",
        str(token_file),
        "--prefix",
        "demo",
        "--nodes",
        "8",
        "--gpus",
        "8",
        "--runs",
        "2",
        "--seed",
        "1",
        "--duration",
        str(6 * 24 * 3600),
        "--speed",
        "1",
        "--interval",
        "1",
        *faults,
        # A busy cluster's jitter and spikes, so the demo shows detection under noise.
        "--noise-cv",
        "0.1",
        "--spikes",
        "--spool-dir",
        str(spool_dir),
    ]


def demo_login(environment: dict[str, str], url: str) -> str:
    """The demo operator with a new password, as the box `manage.py demo_operator` prints."""
    return manage(environment, "demo_operator", "--url", url, capture=True).rstrip()


def child_start(
    commands: dict[str, list[str]], name: str, environment: dict[str, str]
) -> subprocess.Popen:
    # The simulator in a session of its own: Ctrl-C (sent to the terminal's whole process
    # group) reaches it only through the launcher, after the server it delivers to.
    return subprocess.Popen(
        commands[name], cwd=ROOT, env=environment, start_new_session=name == "simulator"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.stack")
    parser.add_argument("command", choices=["run", "demo"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--ws-port", type=int, default=None, help="websockets (default: port+1)")
    parser.add_argument("--web-workers", type=int, default=int(os.environ.get("WEB_WORKERS", 3)))
    parser.add_argument(
        "--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY", 2))
    )
    args = parser.parse_args(argv)
    args.ws_port = args.ws_port or args.port + 1
    os.chdir(ROOT)

    environment, embedded = stack_environment(args.command)
    environment["LIVE_WS_PORT"] = str(args.ws_port)  # where the pages open their websocket
    manage(environment, "migrate", "--noinput", "-v", "0")
    manage(environment, "collectstatic", "--noinput", "-v", "0")
    url = f"http://{args.host}:{args.port}/"
    login = demo_login(environment, url) if args.command == "demo" else None

    children: dict[str, subprocess.Popen] = {}
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        commands = processes(environment, args)
        for name in commands.keys() - {"simulator"}:
            children[name] = child_start(commands, name, environment)
        up = all(
            wait_for_http(f"http://{args.host}:{port}/healthz", give_up=lambda: stopping)
            for port in (args.port, args.ws_port)
        )
        if up and "simulator" in commands:
            # once the server answers: its first batches would time out (and warn) before
            children["simulator"] = child_start(commands, "simulator", environment)
        if up:
            print(f"\nOpsboard is up: {url} (websockets on port {args.ws_port})", flush=True)
        if up and login:
            # last, after the children's start-up output, where a newcomer looks
            print(f"\n{login}\n", flush=True)
        restarts: list[float] = []
        while not stopping:
            for name, child in list(children.items()):
                if child.poll() is None or stopping:
                    continue
                # Restart like systemd would (Celery's worker exits on some broker failures),
                # but give up on a crash loop.
                restarts = [at for at in restarts if at > time.monotonic() - 60] + [
                    time.monotonic()
                ]
                if len(restarts) > MAX_RESTARTS_PER_MINUTE:
                    print(f"{name} keeps exiting; stopping", file=sys.stderr)
                    stopping = True
                    break
                print(f"{name} exited with {child.returncode}; restarting", file=sys.stderr)
                children[name] = child_start(commands, name, environment)
            time.sleep(0.3)
    finally:
        # The simulator first, while the server still takes what it has spooled.
        children_stop([children.pop(name) for name in ("simulator",) if name in children])
        children_stop(children.values())
        if embedded:
            from opsboard.embedded import stop_all

            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
