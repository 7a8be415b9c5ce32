"""A Redis server of the test's own, on 127.0.0.1 and a free port (never the machine's
shared one), which a test may stop, wipe and start again."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import redis

from launcher.procs import free_port, wait_until
from opsboard.embedded import redis_server_binary
from tests.conftest import stack_env
from tests.stackproc import Stack


class PrivateRedis:
    def __init__(self, data_dir: Path) -> None:
        self.port, self.dir = free_port(), data_dir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        # an append-only file: a clean stop and start keeps the queued tasks, as a
        # production Redis with persistence does
        command = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port)]
        command += ["--save", "", "--appendonly", "yes", "--dir", str(self.dir)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_until(self.up, 10, "the private Redis")
        return self

    def up(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.2).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """A clean shutdown: the append-only file holds everything."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nobody answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def lose_everything(self) -> None:
        """Killed, and its data gone with the disk: it comes back empty."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # were it frozen
            self.process.kill()
            self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def keys(self) -> int:
        return int(redis.Redis(port=self.port).dbsize())


@contextlib.contextmanager
def stack_on_private_redis(
    live_stack, directory, *, name: str, publisher: bool = True, **env: str
) -> Iterator[tuple[Stack, PrivateRedis]]:
    """(stack, its Redis): a stack of its own named `name` on a private Redis in `directory`.
    The session stack's workers stand still meanwhile: its sweep would otherwise store this
    test's inbox rows through its own Redis. Afterwards the Redis and its data are gone and
    the session's workers run again."""
    server = PrivateRedis(directory).start()
    live_stack.worker.stop()
    live_stack.periodic.stop()
    stack = Stack(
        stack_env(REDIS_URL=server.url, OPSBOARD_REDIS_PREFIX=f"opsboard-{name}", **env),
        name=name,
        publisher=publisher,
    )
    try:
        yield stack.start(), server
    finally:
        stack.stop()
        server.lose_everything()
        live_stack.worker.start()
        live_stack.periodic.start()
