"""A real single-host Slurm for the tests: munged with a key made here, slurmctld and one
slurmd (Debian's slurm-wlm 22.05), all on loopback (NoInAddrAny and NoCtldInAddrAny
binds them to 127.0.0.1) with ports, state and spool of their own under the test's folder.

Debian's slurmd runs one node per host (no --enable-multiple-slurmd), so the cluster has
one node, `node-01`, whose slurmd runs here. CI installs slurm-wlm and munge (.ci/run) and
fails if they are missing; elsewhere the test is skipped with the apt-get line."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from launcher.procs import free_port
from tests.agent.test_real_exporters import start, stop
from tests.peers import peer_binaries

INSTALL = "apt-get install slurm-wlm munge"
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch")
NODE = "node-01"

CONF = """\
ClusterName=opsboard-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
AuthInfo=socket={munge}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Slurm:
    conf: Path
    folder: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str) -> str:
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    def nodes(self) -> dict[str, tuple[str, str]]:
        """{node: (state as sinfo prints it, reason)}."""
        out = self.command("sinfo", "-h", "-N", "-o", "%N|%T|%E")
        return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


def slurm_start(folder: Path) -> Iterator[Slurm]:
    """Start munged, slurmctld and slurmd; yield once sinfo shows the node idle; stop all."""
    peer_binaries(*BINARIES, install=INSTALL)
    for sub in ("munge", "state", "spool"):
        (folder / sub).mkdir(parents=True)
    key = folder / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    munge = folder / "munge" / "munge.sock"
    conf = folder / "slurm.conf"
    conf.write_text(
        CONF.format(
            host=socket.gethostname(),
            ctld_port=free_port(),
            slurmd_port=free_port(),
            munge=munge,
            dir=folder,
            node=NODE,
        )  # fmt: skip
    )
    slurm = Slurm(conf, folder)
    try:
        slurm.processes.append(
            start(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--socket={munge}",
                    f"--key-file={key}",
                    f"--log-file={folder / 'munge' / 'munged.log'}",
                    f"--pid-file={folder / 'munge' / 'munged.pid'}",
                    f"--seed-file={folder / 'munge' / 'munged.seed'}",
                ],  # fmt: skip
                folder / "munged.out",
            )
        )
        _wait(lambda: munge.exists(), "munged's socket", folder)
        slurm.processes.append(
            start(["slurmctld", "-D", "-f", str(conf)], folder / "slurmctld.out", env=slurm.env)
        )
        _wait(lambda: _responds(slurm), "slurmctld to answer", folder)
        slurm.processes.append(
            start(
                ["slurmd", "-D", "-f", str(conf), "-N", NODE], folder / "slurmd.out", env=slurm.env
            )
        )
        _wait(lambda: _registered(slurm), "slurmd to register, the node idle", folder)
        yield slurm
    finally:
        if len(slurm.processes) == 3:
            _jobs_end(slurm)
        for process in reversed(slurm.processes):
            stop(process)
        _leftovers_kill(conf)


def _jobs_end(slurm: Slurm, timeout: float = 60) -> None:
    """Cancel every job and wait until Slurm has ended them, while its daemons still run:
    a scancel is only a request, and daemons stopped at once left the job's processes (a
    DDP job posting to the live stack long after its test) running."""
    subprocess.run(["scancel", "--full", "--user", "root"], env=slurm.env,
                   capture_output=True, timeout=30, check=False)  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=slurm.env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        if listed.returncode == 0 and not listed.stdout.strip():
            return
        time.sleep(0.5)


def _leftovers_kill(conf: Path) -> None:
    """Kill what still runs with this Slurm's SLURM_CONF in its environment (slurmstepd and
    the job's processes inherit it) once the daemons are stopped: nothing a test started
    may outlive it."""
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get("SLURM_CONF") == str(conf):
                process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


def _registered(slurm: Slurm) -> bool:
    """slurmd has registered (the node has a start time) and the node is idle, responding."""
    shown = slurm.command("scontrol", "-o", "show", "node", NODE)
    started = re.search(r"\bSlurmdStartTime=(\S+)", shown)
    return bool(started) and started[1] != "None" and slurm.nodes()[NODE][0] == "idle"


def _responds(slurm: Slurm) -> bool:
    done = subprocess.run(
        ["scontrol", "ping"], env=slurm.env, capture_output=True, text=True, timeout=10
    )
    return "is UP" in done.stdout


def _wait(predicate, what: str, folder: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = {
                p.name: p.read_text()[-1500:]
                for p in sorted(folder.glob("*.out")) + sorted(folder.glob("*.log"))
            }
            raise AssertionError(f"timed out waiting for {what}: {logs}")
        time.sleep(0.2)
