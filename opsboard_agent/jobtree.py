"""A training job's processes, wherever they moved, found and ended as one.

A process group does not hold a job: `torchrun` starts each worker in a session of its own
(`start_new_session=True` in torch's elastic subprocess handler). Three nets, each catching
what another may miss (docs/actions.md, "Stop: the whole job"):

- the supervisor is a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): a process of the job
  whose parent dies is re-parented to the supervisor, not to init, so the job stays among
  its descendants;
- a cgroup v2 per job where the host lets us make one: membership survives setsid and double
  forks, and `cgroup.kill` ends the whole group in one write;
- the job's environment carries `OPSBOARD_JOB_ID=<unique id>`, which every process that
  inherits it carries too (torchrun hands its environment to the workers): a /proc scan finds
  them, which is all the watchdog (opsboard_agent.jobwatch) has once the supervisor is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

JOB_ENV = "OPSBOARD_JOB_ID"
CGROUP_PREFIX = "opsboard-job-"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05
NAMED_MAX = 20  # survivors named in a detail; the rest are counted


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def become_subreaper() -> bool:
    """Orphans among this process's descendants are re-parented to it (Linux 3.4)."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def child_setup(*, deathsig: int, cgroup: Path | None) -> Callable[[], None]:
    """A `preexec_fn`: the child joins `cgroup` and gets `deathsig` when its parent dies.
    The parent must call it from a thread that lives as long as the job: Linux sends the
    death signal when the thread that forked the child exits, not the process."""
    parent = os.getpid()
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None
    prctl = _PRCTL

    def setup() -> None:
        # Between fork and exec: system calls only (another thread may hold any lock).
        if procs is not None:
            with contextlib.suppress(OSError):  # the supervisor checks and logs it
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, deathsig, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the prctl took hold
                os.kill(os.getpid(), deathsig)

    return setup


# -- cgroup v2 ---------------------------------------------------------------------------


def own_cgroup_v2() -> Path | None:
    """The directory of this process's cgroup in the unified (v2) hierarchy, or None where
    none is mounted (cgroup v1 only, not Linux)."""
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in memberships if line.startswith("0::")), None)
    for line in mounts:  # id parent dev ROOT MOUNT-POINT options... - TYPE SOURCE ...
        fields = line.split()
        if path is not None and fields[fields.index("-") + 1] == "cgroup2":
            root, mount_point = fields[3], fields[4]
            inside = path[len(root) :] if path.startswith(root) else path
            return Path(mount_point) / inside.lstrip("/")
    return None


def cgroup_create(name: str) -> Path | None:
    """A new cgroup v2 beside this process, with `cgroup.kill` (Linux 5.14), or None where
    the host does not let us make one (no v2 hierarchy, no write access, an old kernel)."""
    parent = own_cgroup_v2()
    if parent is None:
        return None
    group = parent / name
    try:
        group.mkdir()
    except OSError:
        return None
    if not (group / "cgroup.kill").exists():
        cgroup_remove(group)
        return None
    return group


def cgroup_pids(group: Path) -> set[int]:
    pids: set[int] = set()
    for directory, _, _ in os.walk(group):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in Path(directory, "cgroup.procs").read_text().split())
    return pids


def cgroup_kill(group: Path) -> bool:
    try:
        (group / "cgroup.kill").write_text("1")
    except OSError:
        return False
    return True


def cgroup_remove(group: Path, wait_s: float = 0.0) -> bool:
    """Remove the group (and any sub-groups) once empty, waiting up to `wait_s` seconds for
    it to empty (a killed process stays in it until its parent reaps it: after a supervisor's
    death, init); a group still in use is left. True when it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        for directory, _, _ in sorted(os.walk(group), key=lambda entry: -len(entry[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        if not group.exists() or time.monotonic() >= deadline:
            return not group.exists()
        time.sleep(POLL_S * 2)


# -- the job -----------------------------------------------------------------------------


@dataclass
class Job:
    """How to find one job's processes: its id (in their environment), its cgroup, and the
    root whose descendants it is (the supervisor; None for the watchdog). `exclude`: pids
    under the root that are not the job (the watchdog)."""

    job_id: str
    cgroup: Path | None = None
    root: int | None = None
    exclude: set[int] = field(default_factory=set)

    def processes(self) -> dict[int, psutil.Process]:
        """Every live (not zombie) process of the job, this process never among them."""
        found: dict[int, psutil.Process] = {}
        if self.root is not None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.root).children(recursive=True):
                    found[child.pid] = child
        if self.cgroup is not None:
            for pid in cgroup_pids(self.cgroup):
                with contextlib.suppress(psutil.Error):
                    found.setdefault(pid, psutil.Process(pid))
        marker = f"{JOB_ENV}={self.job_id}".encode()
        for pid in psutil.pids():
            if pid not in found and _environ_has(pid, marker):
                with contextlib.suppress(psutil.Error):
                    found[pid] = psutil.Process(pid)
        me = os.getpid()
        return {
            pid: process
            for pid, process in found.items()
            if pid != me and pid not in self.exclude and _live(process)
        }

    def end(
        self, *, grace: float, kill_wait: float, reap: Callable[[], None]
    ) -> tuple[list[str], bool]:
        """SIGTERM to every process of the job (and to each that appears meanwhile), up to
        `grace` seconds for all to go, then SIGKILL to all (and `cgroup.kill`), up to
        `kill_wait` seconds more. Returns the survivors as `pid N (name)` (empty when no
        process of the job is left) and whether SIGKILL was needed. `reap` collects our own
        dead children meanwhile."""
        signalled: set[int] = set()
        deadline = time.monotonic() + grace
        while True:
            reap()
            left = self.processes()
            _send(left[pid] for pid in left.keys() - signalled)
            signalled |= left.keys()
            if not left:
                return [], False
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        log.info("%d processes of the job outlived %g s: SIGKILL", len(left), grace)
        if self.cgroup is not None:
            cgroup_kill(self.cgroup)
        deadline = time.monotonic() + kill_wait
        while True:
            _send(left.values(), signal.SIGKILL)
            time.sleep(POLL_S)
            reap()
            left = self.processes()
            if not left or time.monotonic() >= deadline:
                return [describe(process) for process in left.values()], True


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} ({process.name()})"
    except psutil.Error:
        return f"pid {process.pid}"


def survivors_text(survivors: list[str]) -> str:
    named = ", ".join(survivors[:NAMED_MAX])
    more = f" and {len(survivors) - NAMED_MAX} more" if len(survivors) > NAMED_MAX else ""
    count = f"{len(survivors)} process{'' if len(survivors) == 1 else 'es'}"
    return f"{count} of the job survived SIGKILL: {named}{more}"


def reap_children(keep: Iterable[int]) -> None:
    """Collect our dead children but those in `keep` (their Popen collects them): orphans
    of the job are re-parented to a subreaper, which must reap them."""
    keep = set(keep)
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid not in keep and not _live(child):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, os.WNOHANG)


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return marker in environ.read().split(b"\0")
    except OSError:  # gone, another user's, or no /proc
        return False


def _live(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(processes: Iterable[psutil.Process], signum: int = signal.SIGTERM) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)
