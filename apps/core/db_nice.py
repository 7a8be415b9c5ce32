"""A niced process's database work runs niced too.

The launcher runs the ingest pool and the ingest worker niced (INGEST_NICE), so that on
saturated cores page reads, detection and the live feed get the CPU first. But a good part of
ingest's CPU is spent in the Postgres backends that serve it, and those run at the server's
niceness: under full ingest they took the chart query's share (docs/performance-history.md). So a
niced process gives its niceness to each backend of its own, once, when the backend runs on
this host and the OS lets it (the server's user, or root); a process under SCHED_IDLE (the
launcher's INGEST_SCHED_IDLE) moves its backends to SCHED_IDLE too, and a process in an idle
cpu cgroup (the launcher's INGEST_IDLE_GROUP: the class alone orders the tasks of one
scheduling group, and the server's backends are a group of their own) moves them into that
group. With a remote database, a proxy in between (pgbouncer), or no permission, nothing
changes.

Opt-in (DB_BACKEND_NICE, off by default): the backends are the database server's processes,
not Opsboard's. The launcher turns it on for the embedded Postgres, which it owns; with
Postgres on another host it would do nothing, and on a shared host it would change processes
Opsboard does not own unless someone chose it. The idle cpu cgroup is the launcher's to make:
it names it in INGEST_IDLE_GROUP_PATH; this module only reads and joins it.

A backend's pid is the server's view. Before renicing, the process makes sure that the pid
names this connection's backend in its own pid namespace (a server in a container reached
through a forwarded port has pids of another namespace): over TCP, the process title shows
this socket's address and port; over a Unix socket, the backend is a child of the server
process that the kernel names as the socket's peer.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import struct
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection as default_connection

logger = logging.getLogger(__name__)
# Connections background_db closed on purpose: the pool discards them when they come back,
# with a warning meant for connections that died (DroppedOnPurpose keeps it for those).
_dropped: weakref.WeakSet[Any] = weakref.WeakSet()


class DroppedOnPurpose(logging.Filter):
    """Silences psycopg_pool's "discarding closed connection" for the connections dropped
    here on purpose; a connection that broke by itself is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        discarded = record.msg == "discarding closed connection: %s" and record.args
        return not (discarded and isinstance(record.args, tuple) and record.args[0] in _dropped)


_MAX_REMEMBERED = 1000
_tried: set[int] = set()  # backend pids this process has already handled


def backend_nice_follow(sender: Any, connection: Any, **kwargs: Any) -> None:
    """connection_created receiver: renice this connection's backend to this process's
    niceness (pooled connections come back many times; each backend is handled once)."""
    niceness, idle, group = own_priority()
    if niceness <= 0 and not idle and group is None:
        return
    raw = connection.connection
    pid = raw.info.backend_pid
    if pid in _tried:
        return
    if len(_tried) >= _MAX_REMEMBERED:
        _tried.clear()
    _tried.add(pid)
    backend_renice(raw, niceness, idle=idle, group=group)


@functools.cache
def own_priority() -> tuple[int, bool, Path | None]:
    """(niceness, whether in the idle class, the idle cpu cgroup it is in or None) of this
    process, read once: the launcher sets all three when it starts the process (INGEST_NICE,
    INGEST_SCHED_IDLE, INGEST_IDLE_GROUP), and every request checks out a connection (a few
    syscalls each, for nothing, on the web workers)."""
    idle = hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE
    named = settings.INGEST_IDLE_GROUP_PATH
    group = Path(named) if named else None
    in_idle_group = group is not None and group_is_idle(group) and group_holds(group, os.getpid())
    return os.getpriority(os.PRIO_PROCESS, 0), idle, group if in_idle_group else None


def group_is_idle(group: Path) -> bool:
    try:
        return (group / "cpu.idle").read_text().strip() == "1"
    except OSError:
        return False


def group_holds(group: Path, pid: int) -> bool:
    """True when process `pid` is in the cgroup `group` itself (not in a group below it)."""
    try:
        return str(pid) in (group / "cgroup.procs").read_text().split()
    except OSError:
        return False


@contextmanager
def background_db() -> Iterator[None]:
    """Run the block's database work at ingest's priority (INGEST_NICE, and the idle class
    with INGEST_SCHED_IDLE): the maintenance passes (rollups, compaction, pruning) that a
    worker which is not niced itself runs beside detection. They are bulk work derived from
    ingest, and on saturated cores their bursts took the CPU from page reads. A backend
    deprioritised for the block is dropped after it (raising a priority needs root), so the
    next task of the process gets one at the server's. Inside a transaction (a test calling
    the task) nothing changes."""
    niceness = settings.INGEST_NICE
    idle = settings.INGEST_SCHED_IDLE and hasattr(os, "SCHED_IDLE")
    group = Path(settings.INGEST_IDLE_GROUP_PATH) if settings.INGEST_IDLE_GROUP_PATH else None
    lowered = niceness > 0 or idle or group is not None
    if not lowered or not settings.DB_BACKEND_NICE or default_connection.in_atomic_block:
        yield
        return
    default_connection.ensure_connection()
    raw = default_connection.connection
    reniced = backend_renice(raw, niceness, idle=idle, group=group)
    try:
        yield
    finally:
        if reniced:
            raw.close()  # the pool discards a closed connection when it is handed back
            _dropped.add(raw)
            default_connection.close()


def backend_renice(
    raw: Any, niceness: int, *, idle: bool = False, group: Path | None = None
) -> bool:
    """Renice the backend of the psycopg connection `raw` to `niceness` where it is lower,
    with `idle` move it to SCHED_IDLE and with `group` into that cpu cgroup, when it runs on
    this host and the OS allows it; True when anything changed."""
    pid = raw.info.backend_pid
    changed = False
    try:
        if not backend_is_ours(fileno=raw.fileno(), backend_pid=pid):
            return False
        if os.getpriority(os.PRIO_PROCESS, pid) < niceness:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)
            changed = True
        if idle and os.sched_getscheduler(pid) != os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
            changed = True
        if group is not None and not group_holds(group, pid):
            (group / "cgroup.procs").write_text(str(pid))  # raises where not allowed
            changed = True
    except OSError as error:  # not permitted, gone, no /proc: the backend keeps its priority
        logger.debug("backend %s not deprioritised: %s", pid, error)
    return changed


def backend_is_ours(*, fileno: int, backend_pid: int) -> bool:
    """True when `backend_pid` (the server's answer for this connection) names, in this
    process's pid namespace, the backend at the other end of the socket `fileno`. Over a Unix
    socket the check is that it is a child of that server: the pid is then in this namespace,
    and the server gave it for this connection."""
    with socket.socket(fileno=os.dup(fileno)) as sock:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            server_pid = struct.unpack("3i", creds)[0]  # the listening postmaster's
            return server_pid > 0 and _parent_pid(backend_pid) == server_pid
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        host, port = sock.getsockname()[:2]
    title = Path(f"/proc/{backend_pid}/cmdline").read_bytes()
    return title.startswith(b"postgres") and f" {host}({port}) ".encode() in title


def _parent_pid(pid: int) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None
