"""`opsboard-agent supervise -- CMD…`: runs a training command on a node and carries out the
operator commands addressed to it.

    opsboard-agent supervise --server URL --token-file F --run llama-3 --grace 60 -- \
        torchrun --nproc-per-node 8 train.py

- The command runs in its own process group (torchrun and its workers together).
- `stop` (the run) and `drain` (the node): SIGTERM to the group, up to `--grace` seconds
  for it to go, then SIGKILL; acked `accepted`, then `succeeded` with what happened. The
  supervisor stays, waiting for a `resume`.
- `resume`: starts the command again with `OPSBOARD_RESUME_FROM` (the checkpoint's path)
  and `OPSBOARD_NODES` (comma-separated) from the command's `args`, or else from
  `GET /api/v1/runs/NAME/plan`, and reports a `restart` event. A resume while the job runs
  fails (stop it first).
- `checkpoint` commands are left to the reporter inside the job.
- When the job exits by itself the supervisor exits with its status; SIGTERM/SIGINT to the
  supervisor stop the job as `stop` does, then the supervisor exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from opsboard_agent.commands import Command, CommandClient, CommandPoller
from opsboard_agent.records import sanitize_name
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool

log = logging.getLogger(__name__)

KINDS = ("stop", "drain", "resume")


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
    parser.add_argument("--wait", type=float, default=25.0, help="long-poll seconds (≤ 30)")
    parser.add_argument("--spool-dir", type=Path, default=None)
    parser.add_argument("--log-level", default=env("OPSBOARD_LOG_LEVEL", "INFO"))
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the training command")


class Supervisor:
    """Owns one training process group; `handle` is the poller's handler."""

    def __init__(
        self,
        argv: list[str],
        *,
        client: CommandClient,
        node: str,
        run: str | None,
        grace: float,
        shipper: Shipper | None = None,
        wait: float = 25.0,
    ) -> None:
        self.argv, self.client, self.node, self.run_name = argv, client, node, run
        self.grace, self.shipper = grace, shipper
        self.poller = CommandPoller(
            client, node=node, run=run, kinds=KINDS, handle=self.handle, wait=wait
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.held = False  # stopped on purpose: its exit does not end the supervisor
        self.restarts = 0
        self._lock = threading.RLock()
        self._exit = threading.Event()

    # -- the process group ---------------------------------------------------------------

    def start(self, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, **(extra_env or {})}
        env.setdefault("OPSBOARD_NODE", self.node)
        if self.run_name:
            env.setdefault("OPSBOARD_RUN", self.run_name)
        with self._lock:
            self.proc = subprocess.Popen(self.argv, env=env, start_new_session=True)
            self.held = False
            log.info("started %s (pid %d)", self.argv[0], self.proc.pid)
            return self.proc

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> str:
        """SIGTERM to the group, SIGKILL to what is left of it after `grace` seconds."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return "the job was not running"
            deadline = time.monotonic() + self.grace
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                code = None
            # The leader may go first while its workers (same group) still save.
            while code is not None and _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if code is None or _group_alive(proc.pid):
                _signal_group(proc.pid, signal.SIGKILL)
                code = proc.wait()
                return f"killed after {self.grace:g} s grace (exit {code})"
            return f"stopped by SIGTERM (exit {code})"

    # -- commands ------------------------------------------------------------------------

    def handle(self, command: Command) -> None:
        self.poller.ack(command, "accepted")
        if command.kind in ("stop", "drain"):
            with self._lock:
                self.held = True
                detail = self.terminate()
            log.info("%s %s: %s", command.kind, command.id, detail)
            self.poller.ack(command, "succeeded", detail)
        elif command.kind == "resume":
            self.poller.ack(command, *self.resume(command))

    def resume(self, command: Command) -> tuple[str, str]:
        with self._lock:
            if self.running():
                return "failed", "the job is still running; stop it first"
            checkpoint, nodes = self.resume_target(command)
            env = {"OPSBOARD_NODES": ",".join(nodes)}
            if checkpoint:
                env["OPSBOARD_RESUME_FROM"] = checkpoint
            proc = self.start(env)
            self.restarts += 1
        message = f"resumed from {checkpoint or 'scratch'} on {','.join(nodes) or 'no nodes'}"
        if self.shipper is not None:
            self.shipper.add(
                events=(
                    {
                        "ts": time.time(),
                        "kind": "restart",
                        "restart_count": self.restarts,
                        "checkpoint": checkpoint or "",
                        "message": message,
                    },
                )
            )
            self.shipper.flush()
        return "succeeded", f"{message} (pid {proc.pid})"

    def resume_target(self, command: Command) -> tuple[str | None, list[str]]:
        """The command's `args.checkpoint` (a path, or `{"path": …}`) and `args.nodes`;
        what is missing comes from the run's plan."""
        checkpoint: Any = command.args.get("checkpoint")
        nodes: Any = command.args.get("nodes")
        if checkpoint is None or nodes is None:
            plan = self.client.plan(command.run or self.run_name or "")
            if checkpoint is None:
                checkpoint = plan.get("checkpoint")
            if nodes is None:
                nodes = plan.get("nodes") or []
        if isinstance(checkpoint, dict):
            checkpoint = checkpoint.get("path")
        return (str(checkpoint) if checkpoint else None), [str(node) for node in nodes]

    # -- the main loop -------------------------------------------------------------------

    def stop_soon(self, signum: int = signal.SIGTERM, _frame: object = None) -> None:
        log.info("received %s, stopping the job", signal.Signals(signum).name)
        self._exit.set()

    def run(self) -> int:
        """Until the job exits by itself (its status) or the supervisor is told to stop."""
        self.start()
        self.poller.start()
        code = 0
        try:
            while not self._exit.wait(0.2):
                with self._lock:
                    if self.proc is not None and not self.held:
                        status = self.proc.poll()
                        if status is not None:
                            code = status
                            log.info("the job exited with %d", code)
                            break
            if self._exit.is_set():
                log.info("%s", self.terminate())
        finally:
            self.poller.stop()
        return code


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        shipper=shipper,
        wait=args.wait,
    )
    signal.signal(signal.SIGTERM, supervisor.stop_soon)
    signal.signal(signal.SIGINT, supervisor.stop_soon)
    try:
        return supervisor.run()
    finally:
        shipper.close(drain_timeout=5.0)
