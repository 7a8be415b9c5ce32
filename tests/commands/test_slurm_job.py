"""examples/slurm/ddp_train.sbatch submitted to a real Slurm (tests/commands/slurm.py): the DDP
example runs under `opsboard-agent supervise` inside the allocation; Opsboard checkpoints it,
drains its node (the job checkpointed and stopped, the node drained in Slurm by the
ready-made hooks), and after an uncordon resumes it from the checkpoint in the same job."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from apps.clusters.models import Node
from apps.commands.models import ClusterHooks, Command
from apps.commands.presets import SLURM, hooks_preset
from apps.runs.models import RunEvent, StepReport
from launcher.procs import wait_until
from tests.commands.conftest import client
from tests.commands.e2e import command_post
from tests.commands.slurm import NODE, slurm_start

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

RUN = "slurm-ddp"
REPO_SCRIPT = "examples/slurm/ddp_train.sbatch"


@pytest.fixture
def slurm(tmp_path):
    yield from slurm_start(tmp_path / "slurm")


def job_processes(token: Path) -> list[str]:
    """The command lines that name the job's token file: its supervisor, torchrun, ranks."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if str(token) in line:
            found.append(line)
    return found


def ended(command_id: str) -> str:
    return Command.objects.get(pk=command_id).state


def test_a_slurm_job_is_checkpointed_drained_and_resumed(live_stack, world, slurm, tmp_path):
    from tests.agent.conftest import REPO

    world.run.delete()  # the fixture's run "on" node-01 has no job to stop: the drain would wait
    ClusterHooks.objects.create(
        cluster=world.cluster, timeout_s=20, **hooks_preset(SLURM, {"SLURM_CONF": str(slurm.conf)})
    )
    token = tmp_path / "token"
    token.write_text(world.agent_secret)
    token.chmod(0o600)
    exports = {
        "OPSBOARD_SERVER": live_stack.url,
        "OPSBOARD_TOKEN_FILE": str(token),
        "OPSBOARD_RUN": RUN,
        "PYTHON": sys.executable,
        "CHECKPOINTS": str(tmp_path / "checkpoints"),
        # a few steps a second, no checksums: light on a 2-core machine
        "TRAIN_ARGS": "--steps 100000 --step-sleep 0.3 --check-every 100000",
        "OPSBOARD_LOG_LEVEL": "INFO",
    }
    job = slurm.command(
        "sbatch", "--parsable", f"--chdir={REPO}", f"--output={tmp_path / 'job.out'}",
        "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()), REPO_SCRIPT,
    ).strip()  # fmt: skip
    log = tmp_path / "job.out"

    def job_log() -> str:
        return log.read_text()[-3000:] if log.exists() else "(no output yet)"

    try:
        reports = StepReport.objects.filter(run__cluster=world.cluster, run__name=RUN)
        wait_until(lambda: reports.filter(node__name=NODE).exists(), 120, "steps", state=job_log)
        with client(live_stack, world.operator_secret) as operator:
            cluster = world.cluster.name
            saved = command_post(operator, kind="checkpoint", cluster=cluster, run=RUN, reason="t")
            wait_until(lambda: ended(saved) == "succeeded", 120, "the checkpoint", state=job_log)

            drain = command_post(operator, kind="drain", cluster=cluster, node=NODE, reason="XID")
            wait_until(
                lambda: Node.objects.get(cluster=world.cluster, name=NODE).state == "cordoned",
                180,
                "the drain to end cordoned",
                state=lambda: f"{Command.objects.get(pk=drain).state}; {job_log()}",
            )
            state, reason = slurm.nodes()[NODE]
            assert state.startswith(("drain", "drng")) and reason == "opsboard: XID", state
            stopped_at = reports.order_by("-step").first().step

            command_post(operator, kind="uncordon", cluster=cluster, node=NODE, reason="fixed")
            wait_until(lambda: not slurm.nodes()[NODE][0].startswith("drain"), 60, "resumed")
            resumed = command_post(operator, kind="resume", cluster=cluster, run=RUN, reason="go")
            wait_until(lambda: ended(resumed) == "succeeded", 120, "the resume", state=job_log)
            wait_until(
                lambda: RunEvent.objects.filter(
                    cluster=world.cluster, run__name=RUN, kind="restart"
                ).exists(),
                120,
                "the job started again",
                state=job_log,
            )
        # started again in the same allocation from the drain's checkpoint, at its step + 1
        restart = RunEvent.objects.filter(run__name=RUN, kind="restart").first()
        saved_step = int(restart.data["checkpoint"].rsplit("step-", 1)[1])
        assert saved_step <= stopped_at
        after = reports.filter(ts__gte=restart.ts)
        wait_until(after.exists, 120, "steps after the restart", state=job_log)
        assert min(after.values_list("step", flat=True)) == saved_step + 1
        assert slurm.command("squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING"
        # scancel ends the job, the supervised torchrun tree (its own session) included
        slurm.command("scancel", job)
        wait_until(lambda: not job_processes(token), 90, "the job's processes to end")
    finally:
        slurm.command("scancel", job)
