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
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.commands import server_commands
from launcher.cpu_group import idle_group_create, idle_group_remove
from launcher.procs import ROOT, children_stop, wait_for_http

MAX_RESTARTS_PER_MINUTE = 5


def service_env() -> tuple[dict[str, str], bool]:
    """The environment for the children, with both URLs set (and the embedded replica's,
    when OPSBOARD_EMBEDDED_REPLICA asks for it); True if embedded was started."""
    from opsboard.env import truthy

    environment = dict(os.environ)
    embedded = False
    if not environment.get("DATABASE_URL"):
        from opsboard.embedded import database_url

        environment["DATABASE_URL"] = database_url()
        embedded = True
        # the embedded server is ours: its backends may follow ingest's priority
        environment.setdefault("DB_BACKEND_NICE", "true")
        if truthy(environment.get("OPSBOARD_EMBEDDED_REPLICA", "")):
            from opsboard.embedded import replica_url

            environment.setdefault("DATABASE_REPLICA_URL", replica_url())
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


def processes(
    environment: dict[str, str], args: argparse.Namespace, ingest_group: Path | None = None
) -> dict[str, list[str]]:
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
        ingest_group=ingest_group,
    )
    if args.command == "demo":
        commands["simulator"] = simulator_command(
            server=f"http://{args.host}:{args.port}",
            token_file=demo_token(environment, var),
            spool_dir=var / "demo-spool",
        )
    return commands


def ingest_group_prepare(environment: dict[str, str]) -> Path | None:
    """An idle cpu cgroup for ingest (INGEST_IDLE_GROUP, on by default), named to the
    children in INGEST_IDLE_GROUP_PATH (the maintenance passes' backends join it); None
    where the host allows none (launcher.cpu_group)."""
    from opsboard.env import truthy

    if not truthy(environment.get("INGEST_IDLE_GROUP", "true")):
        return None
    group = idle_group_create()
    if group is not None:
        environment["INGEST_IDLE_GROUP_PATH"] = str(group)
    return group


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
    group = ingest_group_prepare(environment)
    try:
        commands = processes(environment, args, ingest_group=group)
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
        if group is not None:
            idle_group_remove(group)
        if embedded:
            from opsboard.embedded import stop_all

            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
