"""Real processes for tests: the servers, Celery workers (ingest; periodic, with beat), live
publisher.

Everything binds 127.0.0.1 and is stopped by the fixture that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from urllib.parse import quote

from launcher.procs import ROOT, free_port, http_ok, wait_until

LOG_DIR = ROOT / "tests" / "artifacts" / "logs"


def database_url(settings_dict: dict) -> str:
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    user = quote(settings_dict.get("USER") or "postgres", safe="")
    password = settings_dict.get("PASSWORD")
    auth = f"{user}:{quote(password, safe='')}" if password else user
    return f"postgres://{auth}@{quote(host, safe='')}{port}/{settings_dict['NAME']}"


class Process:
    """A child process; `supervised` ones are restarted when they exit on their own, as
    systemd or a container runtime would (Celery's worker exits on some broker failures)."""

    def __init__(
        self, name: str, command: list[str], env: dict[str, str], supervised: bool = False
    ) -> None:
        self.name, self.command, self.env = name, command, env
        self.popen: subprocess.Popen | None = None
        self.supervised = supervised
        self.restarts = 0
        self._wanted = False

    def start(self) -> Process:
        self._wanted = True
        self._spawn()
        if self.supervised:
            threading.Thread(target=self._supervise, args=(self.popen,), daemon=True).start()
        return self

    def _supervise(self, popen: subprocess.Popen) -> None:
        while True:
            popen.wait()
            time.sleep(1)
            if not self._wanted or self.popen is not popen:
                return
            self.restarts += 1
            self._spawn()
            popen = self.popen

    def _spawn(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / f"{self.name}.log", "ab") as log:  # the child keeps its own fd
            self.popen = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker's pool children too)."""
        self._wanted = False
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def stop(self) -> None:
        self._wanted = False
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.popen:
            # a child that outlived its group's leader: Celery's embedded beat, or a pool
            # process, of a worker stopped just after its start was left running (orphaned)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Stack:
    """The processes of `make run` (launcher.commands.server_commands) on one database and Redis:
    gunicorn for HTTP, uvicorn for websockets, a supervised Celery worker for ingest, another
    for the periodic queue with beat embedded, and the live publisher."""

    def __init__(
        self, env: dict[str, str], name: str = "stack", publisher: bool = True, workers: bool = True
    ) -> None:
        from launcher.commands import server_commands

        self.name = name
        self.port, self.ws_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "LIVE_WS_PORT": str(self.ws_port)}
        commands = server_commands(
            host="127.0.0.1",
            port=self.port,
            ws_port=self.ws_port,
            web_workers=2,
            worker_concurrency=2,
            queue=self.env.get("OPSBOARD_REDIS_PREFIX", "opsboard"),
            beat_schedule=LOG_DIR / f"{name}-beat-schedule",
            beat_in_worker=True,
        )
        self.web = Process(f"{name}-web", commands["web"], self.env)
        self.ws = Process(f"{name}-ws", commands["ws"], self.env)
        # workers=False: the servers alone, for tests of what HTTP and websockets do by
        # themselves (on a shared test machine, two Celery workers and beat cost real CPU)
        self.worker = (
            Process(f"{name}-worker", commands["worker"], self.env, supervised=True)
            if workers
            else None
        )
        self.periodic = (
            Process(f"{name}-periodic", commands["periodic"], self.env, supervised=True)
            if workers
            else None
        )
        self.publisher = (
            Process(f"{name}-publisher", commands["publisher"], self.env) if publisher else None
        )

    @property
    def processes(self) -> list[Process]:
        processes = (self.web, self.ws, self.worker, self.periodic, self.publisher)
        return [p for p in processes if p is not None]

    def start(self) -> Stack:
        for process in self.processes:
            process.start()
        wait_until(lambda: http_ok(f"{self.url}/healthz"), 60, f"{self.name} web server")
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.ws_port}/healthz"), 60, f"{self.name} ws"
        )
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
