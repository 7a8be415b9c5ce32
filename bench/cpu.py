"""CPU time by role, read from /proc: what a benchmark's stack spent, not how fast it went.

A rate depends on what else the machine runs; CPU seconds per sample much less so (the
same work costs about the same CPU however it is scheduled). `CpuMeter.snapshot()` reads
utime + stime of every process under the stack's children (gunicorn's and Celery's workers
included) and of every Postgres backend serving the bench database; the difference of two
snapshots, per role, divided by the samples stored, is µs of CPU per sample.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class CpuMeter:
    """`roots`: role → pid of a process the stack started (its descendants count to it).
    `backends()`, when given: Postgres backend pid → the role of its client (the stack's
    processes connect with PGAPPNAME=<role>), so that database CPU is split by client."""

    def __init__(
        self,
        roots: dict[str, int],
        database: str,
        backends: Callable[[], dict[int, str]] | None = None,
    ) -> None:
        self.roots, self.database, self.backends = roots, database, backends
        self.clients: dict[int, str] = {}
        self.seen: dict[int, tuple[str, float]] = {}  # pid → (role, CPU s at first sight)
        self.start: Counter[str] = Counter()

    def snapshot(self) -> Counter[str]:
        """CPU seconds per role, of every process seen so far (a process that ended keeps
        its last reading)."""
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(int(entry))):
                parents[int(entry)], cpu[int(entry)] = stat
        by_root = {pid: role for role, pid in self.roots.items()}
        if self.backends is not None:
            self.clients.update(self.backends())
        for pid in cpu:
            role = self._role(pid, parents, by_root)
            if role:
                self.seen[pid] = (role, cpu[pid])
        totals: Counter[str] = Counter()
        for role, seconds in self.seen.values():
            totals[role] += seconds
        return totals

    def _role(self, pid: int, parents: dict[int, int], by_root: dict[int, str]) -> str | None:
        if pid in self.seen:
            return self.seen[pid][0]
        walk = pid
        while walk in parents and walk > 1:
            if walk in by_root:
                return by_root[walk]
            walk = parents[walk]
        if f" {self.database} " in f" {_cmdline(pid)} " and "postgres" in _cmdline(pid):
            client = self.clients.get(pid)
            return f"postgres ({client})" if client else "postgres"
        return None

    def begin(self) -> None:
        self.start = self.snapshot()

    def per_sample_us(self, samples: int) -> dict[str, float]:
        """µs of CPU per sample by role since `begin()`, and their total."""
        spent = self.snapshot()
        spent.subtract(self.start)
        result = {role: seconds * 1e6 / samples for role, seconds in sorted(spent.items())}
        result["total"] = sum(result.values())
        return result
