"""What the benchmarks share: a scratch database, the stack's processes, small statistics."""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
# The scratch database (dropped and created by each run): its own name per concurrent bench.
BENCH_DB = os.environ.get("OPSBOARD_BENCH_DB", "opsboard_bench")
LOG_DIR = ROOT / "var" / "bench-logs"


def prepare_database() -> tuple[dict[str, str], str]:
    """A fresh scratch database on DATABASE_URL's server (or the embedded one), migrated.

    Returns (environment for the stack, libpq conninfo of the scratch database)."""
    import psycopg

    env = dict(os.environ)
    env.setdefault("OPSBOARD_VAR_DIR", str(ROOT / "var" / "bench"))
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        sys.path.insert(0, str(ROOT))
        os.environ["OPSBOARD_VAR_DIR"] = env["OPSBOARD_VAR_DIR"]
        from opsboard import embedded

        env.setdefault("DATABASE_URL", env.get("DATABASE_URL") or embedded.database_url())
        env["REDIS_URL"] = env.get("REDIS_URL") or embedded.redis_url()
    parts = urlsplit(env["DATABASE_URL"])
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(conninfo(admin), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{BENCH_DB}"))
    env["OPSBOARD_REDIS_PREFIX"] = f"opsboard-bench-{os.getpid()}"
    # As deployed: DEBUG off (DEBUG wraps every cursor to record its queries, ~10 % of a web
    # worker's time in a profile), plain HTTP on loopback, the static manifest built.
    env.update(
        DEBUG="false",
        SECRET_KEY=secrets.token_urlsafe(50),
        SECURE_SSL_REDIRECT="false",
        SESSION_COOKIE_SECURE="false",
        CSRF_COOKIE_SECURE="false",
        PYTHONUNBUFFERED="1",
    )
    for command in (["migrate", "-v", "0"], ["collectstatic", "--noinput", "-v", "0"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True)
    return env, conninfo(env["DATABASE_URL"])


def conninfo(url: str) -> str:
    """dj-database-url style (socket dir as a %-encoded host) → a libpq URI psycopg takes."""
    from urllib.parse import unquote

    parts = urlsplit(url)
    host = unquote(parts.hostname or "")
    if host.startswith("/"):
        user = parts.username or "postgres"
        return f"postgresql://{user}@/{parts.path.lstrip('/')}?host={host}"
    return urlunsplit(parts._replace(scheme="postgresql"))


class BenchStack:
    """The processes of `make run`, as launcher.stack starts them (HTTP on gunicorn by
    default; `http="uvicorn"` serves HTTP from the ASGI server too, for comparison)."""

    def __init__(
        self,
        env: dict[str, str],
        web_workers: int,
        concurrency: int,
        http: str = "gunicorn",
        ingest_workers: int = 0,
        ingest_nice: int = 0,
        ingest_sched_idle: bool = False,
        ingest_idle_group: bool = False,
    ) -> None:
        """`ingest_workers` > 0: agents' POSTs go to a gunicorn pool of their own at
        `ingest_url`, as the production proxy routes them (docker/nginx.conf).
        `ingest_nice`: the niceness of the ingest pool and worker, `ingest_sched_idle`: whether
        they run under SCHED_IDLE too, `ingest_idle_group`: in an idle cpu cgroup as well where
        the host allows one (launcher.commands, launcher.cpu_group)."""
        from launcher.commands import server_commands
        from launcher.procs import free_port
        from launcher.stack import ingest_group_prepare

        self.port, self.ws_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ingest_port = free_port() if ingest_workers else None
        self.ingest_url = f"http://127.0.0.1:{ingest_port}" if ingest_port else self.url
        # INGEST_NICE: the maintenance passes run their database work at it too (settings)
        self.env = {**env, "LIVE_WS_PORT": str(self.ws_port), "INGEST_NICE": str(ingest_nice)}
        # the bench measures the tuned local stack: the backends follow ingest's priority
        # (opt-in in a deployment, where the database server need not be Opsboard's)
        self.env.setdefault("DB_BACKEND_NICE", "true")
        # as the launcher makes it, named in the children's environment
        self.group = ingest_group_prepare(self.env) if ingest_idle_group else None
        self.commands = server_commands(
            host="127.0.0.1",
            port=self.port,
            ws_port=self.ws_port,
            web_workers=web_workers,
            worker_concurrency=concurrency,
            queue=env["OPSBOARD_REDIS_PREFIX"],
            beat_schedule=LOG_DIR / "beat-schedule",
            beat_in_worker=True,
            log_level="WARNING",  # as `make run`: two INFO lines per task cost the worker
            ingest_port=ingest_port,
            ingest_workers=ingest_workers,
            ingest_nice=ingest_nice,
            ingest_sched_idle=ingest_sched_idle,
            ingest_group=self.group,
        )
        if http == "uvicorn":
            self.ws_port = self.port
            del self.commands["ws"]
            self.commands["web"] = [
                sys.executable,
                "-m",
                "uvicorn",
                "opsboard.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(web_workers),
                "--no-access-log",
                "--log-level",
                "warning",
            ]
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        from launcher.procs import http_ok, wait_until

        LOG_DIR.mkdir(parents=True, exist_ok=True)
        for name, command in self.commands.items():
            # PGAPPNAME: the role of each Postgres backend, for the CPU split (bench/cpu.py)
            env = {**self.env, "PGAPPNAME": name}
            with open(LOG_DIR / f"{name}.log", "ab") as log:
                self.processes.append(
                    subprocess.Popen(
                        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        for url in {self.url, self.ingest_url}:
            # 180 s: on a loaded shared host gunicorn took over 60 s to import Django
            wait_until(lambda url=url: http_ok(f"{url}/healthz"), 180, f"the web server {url}")
        self._settle()

    def _settle(self, timeout: float = 30) -> None:
        """Wait until the stack's processes are done starting (every gunicorn worker imports
        Django after one has answered): less than a fifth of a core over half a second, so
        that start-up is not counted as the benchmark's CPU."""
        import time

        meter, deadline = self.cpu_meter(), time.monotonic() + timeout
        before = sum(meter.snapshot().values())
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = sum(meter.snapshot().values())
            if now - before < 0.1:
                return
            before = now

    def cpu_meter(self):
        """CPU by role of this stack's processes, its Postgres backends and this client."""
        import psycopg

        from bench.cpu import CpuMeter

        roots = {name: p.pid for name, p in zip(self.commands, self.processes, strict=True)}
        roots["bench client"] = os.getpid()
        database = urlsplit(self.env["DATABASE_URL"]).path.lstrip("/")
        watcher = psycopg.connect(
            conninfo(self.env["DATABASE_URL"]), autocommit=True, application_name="bench client"
        )

        def backends() -> dict[int, str]:
            rows = watcher.execute(
                "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s",
                [database],
            ).fetchall()
            return {pid: name for pid, name in rows if name}

        return CpuMeter(roots, database, backends)

    def stop(self) -> None:
        from launcher.cpu_group import idle_group_remove
        from launcher.procs import children_stop

        children_stop(self.processes, timeout=20)
        if self.group is not None:
            idle_group_remove(self.group)

    def manage(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout


def session_cookie(stack: BenchStack) -> str:
    """Log a bench operator in through the login form; the session cookie for websockets."""
    import httpx

    stack.manage("demo_operator", "--username", "bench", "--password", "bench-password-1")
    with httpx.Client(base_url=stack.url) as client:
        page = client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        client.post(
            "/accounts/login/",
            data={
                "username": "bench",
                "password": "bench-password-1",
                "csrfmiddlewaretoken": token,
            },
            headers={"Referer": f"{stack.url}/accounts/login/"},
        )
        return f"sessionid={client.cookies['sessionid']}"


def sample_rows(count: int) -> list[tuple]:
    """Narrow sample rows (ts, node, metric, gpu, value), shaped like the bench's batches."""
    base = datetime.now(tz=UTC)
    return [
        (base, index // 1000, index % 12, index % 8, float(index % 100) + 0.5)
        for index in range(count)
    ]


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)]


def rollups_wait_current(conninfo_: str) -> None:
    """Until the rollup passes have consumed every dirty range (a pass deletes the ranges it
    claims in the transaction that writes their buckets: none left means all are written)."""
    _wait_zero(
        conninfo_,
        "SELECT (SELECT count(*) FROM history_dirty_series)"
        " + (SELECT count(*) FROM history_dirty_run)",
    )


def inbox_wait_empty(conninfo_: str) -> None:
    """Until every accepted batch is committed (no unprocessed inbox row)."""
    _wait_zero(conninfo_, "SELECT count(*) FROM ingest_inboxbatch WHERE processed_at IS NULL")


def _wait_zero(conninfo_: str, count_sql: str) -> None:
    """Until `count_sql` counts nothing, read every 0.2 s."""
    import time

    import psycopg

    with psycopg.connect(conninfo_, autocommit=True) as conn:
        while conn.execute(count_sql).fetchone()[0]:
            time.sleep(0.2)


def deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that run the ingest pool and worker as deployed (or not), shared by the
    benches that start a stack."""
    parser.add_argument(
        "--ingest-nice",
        type=int,
        default=10,
        help="niceness of the ingest pool and worker, as deployed (INGEST_NICE); 0: none",
    )
    parser.add_argument(
        "--ingest-sched",
        choices=["idle", "normal"],
        default="idle",
        help="scheduling class of the ingest pool and worker, as deployed (INGEST_SCHED_IDLE)",
    )
    parser.add_argument(
        "--ingest-group",
        choices=["idle", "none"],
        default="idle",
        help="an idle cpu cgroup for the ingest pool and worker, as deployed (INGEST_IDLE_GROUP)",
    )
