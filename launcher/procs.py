"""Process helpers shared by the launcher, the tests, the benchmarks and the evaluation:
ports, waiting for a server, stopping children."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on loopback now (for servers started beside another stack)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def children_stop(children: Iterable[subprocess.Popen], timeout: float = 15) -> None:
    """SIGTERM every child still running, then wait for each; kill one that outstays
    `timeout` seconds."""
    children = list(children)
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()


def http_ok(url: str) -> bool:
    """True when `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.1,
    state: Callable[[], str] | None = None,
):
    """The first truthy value of `predicate()`; AssertionError naming `what` after `timeout` s,
    and the state reached (`state()`), so a failure on a slow machine says where it stopped."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            reached = f"; {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{reached}")
        time.sleep(interval)


def wait_for_http(url: str, give_up: Callable[[], bool], timeout: float = 90) -> bool:
    """True once `url` answers; False if `give_up()` turns true first (Ctrl-C)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if give_up():
            return False
        try:
            with urllib.request.urlopen(url, timeout=5):
                return True
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")
