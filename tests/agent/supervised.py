"""Helpers for the tests of `opsboard-agent supervise` as a real process: starting it around a
job, and finding the job's processes the way an operator would, by scanning /proc for a
mark the test put in the job's argv and environment (not by the pids supervise knows)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.agent.command_stub import TOKEN
from tests.agent.conftest import REPO

MARK_ENV = "OPSBOARD_TEST_MARK"


def start_supervisor(
    url: str,
    tmp_path: Path,
    job: list[str],
    *,
    mark: str,
    grace: float,
    kill_wait: float = 5.0,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`supervise` around `job`; its environment (so the job's) carries MARK_ENV=mark."""
    (tmp_path / "token").write_text(TOKEN)
    argv = [sys.executable, "-m", "opsboard_agent", "supervise", "--server", url]
    argv += ["--token-file", str(tmp_path / "token"), "--node", "node-01", "--run", "run-1"]
    argv += ["--grace", f"{grace:g}", "--kill-wait", f"{kill_wait:g}", "--wait", "1"]
    argv += ["--spool-dir", str(tmp_path / "spool"), *options, "--", *job]
    full_env = {**os.environ, "PYTHONPATH": str(REPO), MARK_ENV: mark, **(env or {})}
    return subprocess.Popen(argv, env=full_env, stderr=subprocess.PIPE, text=True)


@dataclass(frozen=True)
class Seen:
    pid: int
    state: str  # /proc/PID/stat's: R, S, D, T, Z…
    sid: int
    cgroup: str  # the unified hierarchy's path ("0::…"), "" where none
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} sid {self.sid} {self.state} [{self.cgroup}] {self.cmdline[:150]}"


def scan(mark: str, *, exclude: set[int]) -> list[Seen]:
    """Every process on the host whose cmdline or environment carries `mark`, but `exclude`
    (the supervisor, whose own argv and environment carry it) and this process."""
    needle = mark.encode()
    seen = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude | {os.getpid()}:
            continue
        base = Path("/proc", entry)
        try:
            cmdline = (base / "cmdline").read_bytes()
            environ = (base / "environ").read_bytes()
            stat = (base / "stat").read_text()
            groups = (base / "cgroup").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        if needle not in cmdline and needle not in environ:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp session
        unified = next((line[3:] for line in groups if line.startswith("0::")), "")
        text = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        seen.append(Seen(int(entry), fields[0], int(fields[3]), unified, text))
    return sorted(seen, key=lambda process: process.pid)


def report(title: str, processes: list[Seen]) -> str:
    lines = [f"/proc scan {title}: {len(processes)} processes"]
    lines += [f"  {process}" for process in processes]
    text = "\n".join(lines)
    print(text)
    return text
