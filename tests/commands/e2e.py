"""The harness of the commands' end-to-end test: a live stack whose processes find a
`scontrol` stand-in first on PATH, and examples/ddp_train.py under torchrun on two
"nodes" (tests/commands/e2e_launch.py) wrapped in `opsboard-agent supervise`.

Nothing here is simulated: the stand-in is a real executable that records its argv, the job
is a real DDP job whose ranks report through the reporter, and supervise is the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from launcher.procs import wait_until
from tests.stackproc import LOG_DIR, Stack

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "tests" / "commands" / "e2e_launch.py"

SCONTROL = """#!{python}
import json, sys
with open({record!r}, "a") as record:
    record.write(json.dumps(sys.argv[1:]) + "\\n")
print("scontrol stand-in: node updated")
"""


def scontrol_standin(bin_dir: Path, record: Path) -> Path:
    """A `scontrol` in `bin_dir` that appends each call's argv (a JSON list) to `record`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(SCONTROL.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    return script


def calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def start_hooked_stack(env: dict[str, str], bin_dir: Path) -> Stack:
    """A stack (web, ASGI, workers, publisher) whose PATH starts with `bin_dir`: the
    workers run the scheduler hooks (commands.node_carry_out)."""
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return Stack({**env, "PATH": path}, name="e2e").start()


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, state: Callable[[], str] = str
):
    """launcher.procs.wait_until, polling every 0.2 s and naming the state reached."""
    return wait_until(predicate, timeout, what, interval=0.2, state=state)


def command_post(operator: Any, *, kind: str, cluster: str, **body: Any) -> str:
    """Issue a command through the API as `operator` (an httpx client with its token); its id.
    201 for a run command, 202 for a node command (carried out by a worker)."""
    response = operator.post(
        "/api/v1/commands",
        json={"kind": kind, "cluster": cluster, **body},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code in (201, 202), response.text
    return response.json()["id"]


class SupervisedJob:
    """`opsboard-agent supervise --node NODE --run RUN -- e2e_launch.py --ranks RANKS …` in its
    own session, its output in tests/artifacts/logs/LOG_NAME.log."""

    def __init__(
        self,
        *,
        server: str,
        secret: str,
        run: str,
        node: str,
        workdir: Path,
        nodes: str,
        ranks: int = 4,
        log_name: str = "e2e-job",
    ) -> None:
        self.workdir, self.run, self.node = workdir, run, node
        self.token_file = workdir / "token"
        self.token_file.write_text(secret)
        self.token_file.chmod(0o600)
        self.launches_log = workdir / "launches.jsonl"
        self.checkpoint_dir = workdir / "checkpoints"  # one shared directory: "durable"
        self.log_path = LOG_DIR / f"{log_name}.log"
        self.argv = [
            *(sys.executable, "-m", "opsboard_agent", "supervise", "--server", server),
            *("--token-file", str(self.token_file), "--node", node, "--run", run),
            *("--grace", "20", "--wait", "10", "--spool-dir", str(workdir / "supervise-spool")),
            "--",
            *(sys.executable, str(LAUNCH), "--ranks", str(ranks), "--default-nodes", nodes),
            *("--spool-dir", str(workdir / "spool"), "--log", str(self.launches_log), "--"),
            *("--server", server, "--token-file", str(self.token_file), "--run", run),
            # a few steps a second, no checksums: light on a 2-core machine
            *("--steps", "100000", "--step-sleep", "0.3", "--check-every", "100000"),
            *("--checkpoint-dir", str(self.checkpoint_dir)),
        ]
        self.popen: subprocess.Popen | None = None
        self._seen: dict[int, psutil.Process] = {}

    def start(self) -> SupervisedJob:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def launches(self) -> list[dict]:
        """One record per start of the job (e2e_launch.py): nodes, resume_from, pids."""
        if not self.launches_log.exists():
            return []
        return [json.loads(line) for line in self.launches_log.read_text().splitlines()]

    def remember_processes(self) -> None:
        """Note every process below the supervisor now: torchrun starts its ranks in sessions
        of their own, which a signal to the supervisor's group does not reach."""
        if self.popen is None:
            return
        try:
            for child in psutil.Process(self.popen.pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def alive(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def survivors(self) -> list[int]:
        """Every process ever seen below the supervisor (remember_processes) still alive."""
        self.remember_processes()
        return [pid for pid in self._seen if self.alive(pid)]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to the supervisor (it stops the job within its grace), then SIGKILL to
        whatever of the job is left: its group and every process it ever had below it."""
        if self.popen is None:
            return
        self.remember_processes()
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        for process in self._seen.values():
            try:
                if process.is_running():
                    process.kill()
            except psutil.NoSuchProcess:
                pass
