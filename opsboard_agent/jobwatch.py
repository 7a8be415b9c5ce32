"""The job's watchdog: ends the job when its supervisor is gone, however it went.

    python -m opsboard_agent.jobwatch --job-id ID [--cgroup DIR] --grace S --kill-wait S

`opsboard-agent supervise` starts one per job, before the job, with the read end of a pipe
as its stdin; the supervisor holds the write end (no process of the job inherits it). The
pipe reads end-of-file when the supervisor exits, even by SIGKILL, where nothing the
supervisor does can run: then the watchdog ends every process of the job (its cgroup, and
every process whose environment carries the job's id: the supervisor's tree is gone) as a
stop does, removes the cgroup and exits. After a supervisor that stopped the job itself it
finds nothing and exits at once. It ignores SIGINT, SIGTERM and SIGHUP (a terminal's or a
service manager's signals to everything go to the supervisor, which stops the job), in a
session of its own, and its environment is not the job's (the scan must not find it).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from opsboard_agent.jobtree import Job, cgroup_remove, survivors_text

log = logging.getLogger("opsboard_agent.jobwatch")
CGROUP_EMPTY_WAIT_S = 10.0


def start(
    *, job_id: str, cgroup: Path | None, grace: float, kill_wait: float
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a job's watchdog: (the process, the write end of its pipe, for the caller to
    hold while the job lives and close once no process of it is left)."""
    argv = [sys.executable, "-m", "opsboard_agent.jobwatch", "--job-id", job_id]
    argv += ["--grace", f"{grace:g}", "--kill-wait", f"{kill_wait:g}"]
    if cgroup is not None:
        argv += ["--cgroup", str(cgroup)]
    # Not the job's environment: a scan for the job's marks must not find the watchdog.
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    read_end, write_end = os.pipe()  # not inheritable: no process of the job holds either
    try:
        watchdog = subprocess.Popen(argv, stdin=read_end, env=env, start_new_session=True)
    except OSError:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return watchdog, write_end


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsboard_agent.jobwatch")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--cgroup", type=Path, default=None)
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("--kill-wait", type=float, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="jobwatch %(levelname)s %(message)s")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while True:  # until the supervisor's end of the pipe closes
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    job = Job(job_id=args.job_id, cgroup=args.cgroup)
    if job.processes():
        log.warning("the supervisor is gone; ending job %s", args.job_id)
    survivors, _ = job.end(grace=args.grace, kill_wait=args.kill_wait, reap=lambda: None)
    if args.cgroup is not None and not cgroup_remove(args.cgroup, wait_s=CGROUP_EMPTY_WAIT_S):
        log.warning("cgroup %s is still in use; left in place", args.cgroup)
    if survivors:
        log.error("%s", survivors_text(survivors))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
