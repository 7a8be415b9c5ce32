"""Processes left behind by a checkout: every process whose executable, working directory or
command line lies under a folder, found by scanning /proc (not by pids anybody remembers).

`python -m launcher.leftovers DIR` prints one line per such process and exits 1 if there is
any (CI runs it after `make test` in a lone clone on the embedded default).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def processes_under(folder: Path) -> list[str]:
    """'pid command line' of each process (other than this one) that runs from, in, or on
    files of `folder`: an embedded Postgres names its data directory on its command line, a
    daemonised Redis keeps its working directory there and its binary in the clone's venv."""
    root = str(folder.resolve())
    mine = _ancestors()  # this scan and whoever runs it (a shell sitting in the folder)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            command = " ".join(part.decode(errors="replace") for part in argv if part)
            places = [os.readlink(entry / "exe"), os.readlink(entry / "cwd")]
        except OSError:  # gone meanwhile, a kernel thread, or not ours to read
            continue
        if root in command or any(_under(place, root) for place in places):
            found.append(f"{entry.name} {command}")
    return found


def _ancestors() -> set[int]:
    """This process and its parents up to init."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
    return pids


if __name__ == "__main__":
    survivors = processes_under(Path(sys.argv[1]))
    for line in survivors:
        print(f"left running: {line}")
    sys.exit(1 if survivors else 0)
