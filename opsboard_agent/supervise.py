"""`opsboard-agent supervise -- CMD…`: runs a training command on a node and carries out the
operator commands addressed to it.

    opsboard-agent supervise --server URL --token-file F --run llama-3 --grace 60 -- \
        torchrun --nproc-per-node 8 train.py

- The supervisor owns every process the command starts, whatever session it moves to
  (torchrun's workers each start a session of their own): opsboard_agent.jobtree.
- `stop` (the run) and `drain` (the node): SIGTERM to every process of the job, up to
  `--grace` seconds for them to go, then SIGKILL to all that are left; acked `accepted`,
  then `succeeded` once no process of the job is left, else `failed` naming the survivors.
  The supervisor stays, waiting for a `resume`.
- `resume`: starts the command again, from the supervisor's environment without any
  `OPSBOARD_RESUME_*` / `OPSBOARD_NODES` it had, with `OPSBOARD_RESUME_FROM` (the checkpoint's
  path), `OPSBOARD_RESUME_STEP` and `OPSBOARD_NODES` (comma-separated) from the command's
  `args`, or else from `GET /api/v1/runs/NAME/plan`, and reports a `restart` event. A resume
  while any process of the job is left, or once the supervisor is shutting down, fails.
- A command past its `expires_at` is not carried out: acked `failed`.
- The job dies with the supervisor: its first process gets SIGTERM when the supervisor dies
  (`PR_SET_PDEATHSIG`), and a watchdog (opsboard_agent.jobwatch) ends the rest of it.
- `checkpoint` commands are left to the reporter inside the job.
- When the job exits by itself the supervisor ends what is left of it and exits with its
  status; SIGTERM/SIGINT to the supervisor stop the job as `stop` does, then it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsboard_agent import jobtree, jobwatch
from opsboard_agent.commands import Command, CommandClient, CommandPoller
from opsboard_agent.records import sanitize_name
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool

log = logging.getLogger(__name__)

KINDS = ("stop", "drain", "resume")
# What a resume sets; never carried over from the supervisor's environment or a previous one
RESUME_ENV = ("OPSBOARD_RESUME_FROM", "OPSBOARD_RESUME_STEP", "OPSBOARD_NODES")
SHUTTING_DOWN = "the supervisor is shutting down"
WATCHDOG_EXIT_S = 2.0  # how long a watchdog is waited for once its job is done


def add_parser(commands: Any) -> None:
    env = os.environ.get
    parser = commands.add_parser("supervise", help="run a training command; obey stop/resume")
    parser.add_argument("--server", default=env("OPSBOARD_SERVER"))
    parser.add_argument("--token-file", default=env("OPSBOARD_TOKEN_FILE"))
    parser.add_argument("--node", default=env("OPSBOARD_NODE") or socket.gethostname())
    parser.add_argument("--run", default=env("OPSBOARD_RUN"), help="the run the command trains")
    parser.add_argument(
        "--grace",
        type=float,
        default=float(env("OPSBOARD_GRACE", "30")),
        help="seconds between SIGTERM and SIGKILL (default 30)",
    )
    parser.add_argument(
        "--kill-wait",
        type=float,
        default=float(env("OPSBOARD_KILL_WAIT", "10")),
        help="seconds after SIGKILL before a stop with survivors fails (default 10)",
    )
    parser.add_argument(
        "--no-cgroup", action="store_true", help="do not put the job in a cgroup of its own"
    )
    parser.add_argument("--wait", type=float, default=25.0, help="long-poll seconds (≤ 30)")
    parser.add_argument("--spool-dir", type=Path, default=None)
    parser.add_argument("--log-level", default=env("OPSBOARD_LOG_LEVEL", "INFO"))
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the training command")


@dataclass
class _Start:
    """A resume's start, handed to the main thread (the one thread that starts jobs: the
    job's death signal follows the thread that forked it)."""

    command: Command
    env: dict[str, str]
    answer: Future[tuple[str, str]] = field(default_factory=Future)


class Supervisor:
    """Owns one training job's processes; `handle` is the poller's handler."""

    def __init__(
        self,
        argv: list[str],
        *,
        client: CommandClient,
        node: str,
        run: str | None,
        grace: float,
        kill_wait: float = 10.0,
        use_cgroup: bool = True,
        shipper: Shipper | None = None,
        wait: float = 25.0,
    ) -> None:
        self.argv, self.client, self.node, self.run_name = argv, client, node, run
        self.grace, self.kill_wait, self.use_cgroup = grace, kill_wait, use_cgroup
        self.shipper = shipper
        self.poller = CommandPoller(
            client, node=node, run=run, kinds=KINDS, handle=self.handle, wait=wait
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.job: jobtree.Job | None = None
        self.held = False  # stopped on purpose: its exit does not end the supervisor
        self.restarts = 0
        self.starts = 0
        self._lock = threading.RLock()
        self._exit = threading.Event()
        self._closing = threading.Event()
        self._starts: queue.Queue[_Start] = queue.Queue()
        self._starts_lock = threading.Lock()  # `_closing` and the queue change together
        self._watchdogs: dict[int, subprocess.Popen[bytes]] = {}
        self._watchdog_pipe: int | None = None  # our end: closing it lets the watchdog go

    # -- the job -------------------------------------------------------------------------

    def start(self, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start the command as a new job (main thread only: see `_Start`). `extra_env`: a
        resume's; its start drops any RESUME_ENV the supervisor's own environment has (the
        first start keeps them: whoever started the supervisor set them for it)."""
        env = dict(os.environ)
        if extra_env is not None:
            env = {key: value for key, value in env.items() if key not in RESUME_ENV}
            env.update(extra_env)
        env.setdefault("OPSBOARD_NODE", self.node)
        if self.run_name:
            env.setdefault("OPSBOARD_RUN", self.run_name)
        with self._lock:
            self._job_done()
            self.starts += 1
            job_id = f"{os.getpid()}-{self.starts}-{uuid.uuid4().hex[:12]}"
            cgroup = None
            if self.use_cgroup:
                cgroup = jobtree.cgroup_create(f"{jobtree.CGROUP_PREFIX}{job_id}")
            env[jobtree.JOB_ENV] = job_id
            self._watchdog_start(job_id, cgroup)  # first: it must outlive a supervisor's crash
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                start_new_session=True,  # a terminal's ^C reaches the supervisor only
                preexec_fn=jobtree.child_setup(deathsig=signal.SIGTERM, cgroup=cgroup),
            )
            if cgroup is not None and self.proc.pid not in jobtree.cgroup_pids(cgroup):
                log.warning("the job did not join its cgroup %s; going without", cgroup)
                cgroup = None
            self.job = jobtree.Job(
                job_id=job_id, cgroup=cgroup, root=os.getpid(), exclude=set(self._watchdogs)
            )
            self.held = False
            log.info(
                "started %s (pid %d, job %s, cgroup %s)",
                self.argv[0],
                self.proc.pid,
                job_id,
                cgroup,
            )
            return self.proc

    def running(self) -> bool:
        """Any process of the job left (its first one, or any it started)."""
        with self._lock:
            if self.proc is None or self.job is None:
                return False
            return self.proc.poll() is None or bool(self.job.processes())

    def terminate(self) -> tuple[bool, str]:
        """End every process of the job: (no process left, what happened)."""
        with self._lock:
            proc, job = self.proc, self.job
            if proc is None or job is None or not self.running():
                self._job_done()
                return True, "the job was not running"
            job.exclude = set(self._watchdogs)
            survivors, killed = job.end(grace=self.grace, kill_wait=self.kill_wait, reap=self._reap)
            try:
                code: int | None = proc.wait(0 if survivors else self.kill_wait)
            except subprocess.TimeoutExpired:
                code = None
            if survivors:
                return False, f"{jobtree.survivors_text(survivors)} ({self.grace:g} s grace)"
            self._job_done()
            if killed:
                return True, f"killed after {self.grace:g} s grace (exit {code})"
            return True, f"stopped by SIGTERM (exit {code})"

    def _job_done(self) -> None:
        """The job has no process left: let its watchdog go (it finds nothing, removes the
        cgroup) and forget the job."""
        if self._watchdog_pipe is not None:
            os.close(self._watchdog_pipe)
            self._watchdog_pipe = None
        if self.job is not None and self.job.cgroup is not None:
            jobtree.cgroup_remove(self.job.cgroup)
        self.job = None

    def _watchdog_start(self, job_id: str, cgroup: Path | None) -> None:
        watchdog, self._watchdog_pipe = jobwatch.start(
            job_id=job_id, cgroup=cgroup, grace=self.grace, kill_wait=self.kill_wait
        )
        self._watchdogs[watchdog.pid] = watchdog

    def _reap(self) -> None:
        """Collect dead orphans of the job (we are their subreaper) and finished watchdogs."""
        for pid, watchdog in list(self._watchdogs.items()):
            if watchdog.poll() is not None:
                del self._watchdogs[pid]
        keep = set(self._watchdogs) | ({self.proc.pid} if self.proc is not None else set())
        jobtree.reap_children(keep)

    # -- commands ------------------------------------------------------------------------

    def handle(self, command: Command) -> None:
        if command.expired():
            self.poller.ack(command, "failed", "expired before it could be carried out")
            return
        self.poller.ack(command, "accepted")
        if command.kind in ("stop", "drain"):
            with self._lock:
                self.held = True
                ended, detail = self.terminate()
            log.info("%s %s: %s", command.kind, command.id, detail)
            self.poller.ack(command, "succeeded" if ended else "failed", detail)
        elif command.kind == "resume":
            self.poller.ack(command, *self.resume(command))

    def resume(self, command: Command) -> tuple[str, str]:
        if self._closing.is_set():
            return "failed", SHUTTING_DOWN
        if self.running():
            return "failed", "the job is still running; stop it first"
        checkpoint, step, nodes = self.resume_target(command)
        env = {"OPSBOARD_NODES": ",".join(nodes)}
        if checkpoint:
            env["OPSBOARD_RESUME_FROM"] = checkpoint
        if step is not None:
            env["OPSBOARD_RESUME_STEP"] = str(step)
        request = _Start(command, env)
        with self._starts_lock:
            if self._closing.is_set():
                return "failed", SHUTTING_DOWN
            self._starts.put(request)
        state, pid = request.answer.result()  # the main thread answers each, even when closing
        if state != "succeeded":
            return state, pid
        message = f"resumed from {checkpoint or 'scratch'} on {','.join(nodes) or 'no nodes'}"
        if self.shipper is not None:
            event = {"ts": time.time(), "kind": "restart", "restart_count": self.restarts}
            event.update(checkpoint=checkpoint or "", message=message)
            self.shipper.add(events=(event,))
            self.shipper.flush()
        return "succeeded", f"{message} (pid {pid})"

    def _serve_start(self, request: _Start) -> None:
        """Main thread: start a resume's job unless something changed while it queued."""
        with self._lock:
            if self._closing.is_set():
                answer = ("failed", SHUTTING_DOWN)
            elif request.command.expired():
                answer = ("failed", "expired before it could be carried out")
            elif self.running():
                answer = ("failed", "the job is still running; stop it first")
            else:
                try:
                    proc = self.start(request.env)
                except (OSError, subprocess.SubprocessError) as exc:  # the job cannot start
                    answer = ("failed", f"cannot start the command: {exc}"[:1000])
                else:
                    self.restarts += 1
                    answer = ("succeeded", str(proc.pid))
        request.answer.set_result(answer)

    def resume_target(self, command: Command) -> tuple[str | None, int | None, list[str]]:
        """The command's `args.checkpoint` (a path, or `{"path": …, "step": …}`), `args.step`
        and `args.nodes`; what is missing comes from the run's plan (its checkpoint's step
        with its checkpoint)."""
        checkpoint: Any = command.args.get("checkpoint")
        step: Any = command.args.get("step")
        nodes: Any = command.args.get("nodes")
        if checkpoint is None or nodes is None:
            plan = self.client.plan(command.run or self.run_name or "")
            if checkpoint is None:
                checkpoint = plan.get("checkpoint")
            if nodes is None:
                nodes = plan.get("nodes") or []
        if isinstance(checkpoint, dict):
            step = checkpoint.get("step") if step is None else step
            checkpoint = checkpoint.get("path")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            step = None
        path = str(checkpoint) if checkpoint else None
        return path, (step if path else None), [str(node) for node in nodes]

    # -- the main loop -------------------------------------------------------------------

    def stop_soon(self, signum: int = signal.SIGTERM, _frame: object = None) -> None:
        log.info("received %s, stopping the job", signal.Signals(signum).name)
        self._exit.set()

    def run(self) -> int:
        """Until the job exits by itself (its status) or the supervisor is told to stop."""
        if not jobtree.become_subreaper():
            log.warning("not a subreaper here: a job's orphans are found by their environment")
        self.start()
        self.poller.start()
        code = 0
        try:
            while not self._exit.is_set():
                try:
                    self._serve_start(self._starts.get(timeout=0.2))
                    continue
                except queue.Empty:
                    pass
                with self._lock:
                    self._reap()
                    if self.proc is not None and not self.held:
                        status = self.proc.poll()
                        if status is not None:
                            code = status
                            log.info("the job exited with %d", code)
                            break
        finally:
            with self._starts_lock:
                self._closing.set()
            while not self._starts.empty():
                self._starts.get().answer.set_result(("failed", SHUTTING_DOWN))
            ended, detail = self.terminate()
            log.log(logging.INFO if ended else logging.ERROR, "%s", detail)
            self.poller.stop()
            self._job_done()
            self._watchdogs_wait()
        return code if ended else code or 1

    def _watchdogs_wait(self) -> None:
        """A watchdog still running after a while outlives us, ending a job that would not
        die."""
        deadline = time.monotonic() + WATCHDOG_EXIT_S
        for watchdog in self._watchdogs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(max(0.0, deadline - time.monotonic()))


def main(args: argparse.Namespace) -> int:
    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        log.error("no command to supervise: opsboard-agent supervise [options] -- CMD…")
        return 2
    if not args.server or not args.token_file:
        log.error("--server and --token-file (or OPSBOARD_SERVER, OPSBOARD_TOKEN_FILE) required")
        return 2
    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as exc:
        log.error("cannot read the token file: %s", exc)
        return 2
    node = sanitize_name(args.node)
    run = sanitize_name(args.run) if args.run else None
    spool_dir = args.spool_dir or (
        Path(tempfile.gettempdir()) / "opsboard-agent" / f"supervise-{node}-{run or 'none'}"
    )
    spool = Spool(spool_dir, max_bytes=16 * 1024 * 1024)
    sender = Sender(spool, server=args.server, token=token)
    shipper = Shipper(spool=spool, sender=sender, node=node, run=run).start()
    supervisor = Supervisor(
        argv,
        client=CommandClient(server=args.server, token=token),
        node=node,
        run=run,
        grace=args.grace,
        kill_wait=args.kill_wait,
        use_cgroup=not args.no_cgroup,
        shipper=shipper,
        wait=args.wait,
    )
    signal.signal(signal.SIGTERM, supervisor.stop_soon)
    signal.signal(signal.SIGINT, supervisor.stop_soon)
    try:
        return supervisor.run()
    finally:
        shipper.close(drain_timeout=5.0)
