"""An idle CPU group for ingest, and running a command inside it:

    python -m launcher.cpu_group GROUP_DIR -- COMMAND [ARGS...]

The idle scheduling class (INGEST_SCHED_IDLE) orders the tasks of one scheduling group only.
With autogroup (Linux's default where it is built in: one group per session) or a cgroup
per service (systemd), Postgres's backends are one group and the stack another, and a group
whose runnable tasks are all idle-class still competes with a page read's group at its full
weight: a chart read under ingest then waits its turn at most of its dozen wake-ups (chart
p95 under ingest ÷ idle 1.5–2.3 with the class alone, 1.1–1.3 in an idle group:
docs/performance-history.md). A cpu cgroup with `cpu.idle` set (Linux 5.15) yields, as a whole,
to every other group: ingest's processes run in one, and their local Postgres backends
follow them there (apps/core/db_nice.py).

Making a group needs a writable cpu controller: root with cgroup v1, or a delegated cgroup
v2 subtree whose own group holds no process. Where there is none, `idle_group_create`
returns None and ingest keeps the idle class and its niceness.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

GROUP_PREFIX = "opsboard-ingest-"


def own_cpu_group(pid: int | str = "self") -> Path | None:
    """The directory of the cpu cgroup process `pid` is in (cgroup v1's cpu hierarchy, else
    the unified v2 one), or None where no cgroup filesystem with the cpu controller is
    mounted or /proc cannot tell."""
    try:
        memberships = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    # mountinfo: id parent dev ROOT MOUNT-POINT options... - TYPE SOURCE SUPER-OPTIONS
    where: dict[str, tuple[str, str]] = {}
    for line in mounts:
        fields = line.split()
        kind, options = fields[fields.index("-") + 1], fields[fields.index("-") + 3]
        if kind == "cgroup" and "cpu" in options.split(","):
            where["v1"] = (fields[3], fields[4])
        elif kind == "cgroup2":
            where["v2"] = (fields[3], fields[4])
    for line in memberships:  # hierarchy:controllers:path
        _, controllers, path = line.split(":", 2)
        version = "v1" if "cpu" in controllers.split(",") else "v2" if not controllers else ""
        if version in where and (version == "v1" or "v1" not in where):
            root, mount_point = where[version]
            inside = path[len(root) :] if path.startswith(root) else path
            return Path(mount_point) / inside.lstrip("/")
    return None


def group_is_idle(group: Path) -> bool:
    try:
        return (group / "cpu.idle").read_text().strip() == "1"
    except OSError:
        return False


def idle_group_create() -> Path | None:
    """A new idle cpu cgroup under this process's own (named after this process), or None
    where none can be made."""
    parent = own_cpu_group()
    if parent is None:
        return None
    group = parent / f"{GROUP_PREFIX}{os.getpid()}"
    children_control = parent / "cgroup.subtree_control"  # v2 only: enable cpu below
    try:
        if children_control.exists() and "cpu" not in children_control.read_text().split():
            children_control.write_text("+cpu")
        group.mkdir(exist_ok=True)
        (group / "cpu.idle").write_text("1")
    except OSError:
        idle_group_remove(group, wait_s=0)
        return None
    return group


def idle_group_remove(group: Path, wait_s: float = 5.0) -> bool:
    """Remove the group once its last process has gone (backends exit shortly after the
    processes they served); True when it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def group_join(group: Path, pid: int | str = 0) -> None:
    """Move process `pid` (0: this one) into the group; raises OSError where not allowed."""
    (group / "cgroup.procs").write_text(str(pid or os.getpid()))


def main(argv: list[str]) -> None:
    """Join GROUP_DIR, then become COMMAND (like cgexec): its children stay in the group."""
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m launcher.cpu_group GROUP_DIR -- COMMAND [ARGS...]")
    group_join(Path(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
