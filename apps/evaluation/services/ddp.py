"""examples/ddp_train.py in the evaluation: real torchrun jobs on CPU ranks (gloo), whose
timing jitters the way a busy shared host does (nothing in them is simulated).

- `DDP_FAULTS`: rank 3 sleeps 50 ms in its compute phase (a straggler), rank 1's gradient
  hook perturbs its local gradients at every step (an SDC only its canary shows), rank 2
  flips one bit of a weight at step 20 (its parameter checksum diverges).
- `DDP_COMPUTE`: rank 2 computes more — its forward and backward run twice per step on a
  model wide enough that compute is most of a step — with 4 ranks pinned to 2 cores, so
  every rank's timing is as noisy as an oversubscribed host makes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.clusters.models import Cluster
from apps.evaluation.services.scenarios import ScenarioSpec
from apps.runs.models import StepReport
from launcher.procs import ROOT

DDP_RANKS = 4
DDP_STEP_S = 0.5  # the runs last seconds: evaluate twice a second of them
DDP_TIMEOUT_S = 600
PINNED_CORES = 2


@dataclass(frozen=True)
class DdpJob:
    spec: ScenarioSpec
    run: str
    steps: int
    check_every: int
    args: tuple[str, ...]
    faults: tuple[tuple[str, str, int, dict[str, Any]], ...]  # (label, kind, rank, params)
    pin_cores: int = 0  # 0: as the OS schedules; N: every rank on the same first N cores
    flip: tuple[int, int] | None = None  # (rank, step) of a bit flip: its fault starts there


DDP_FAULTS = DdpJob(
    spec=ScenarioSpec("ddp", (), 0, 0.0, 1.0, noise_cv=0.0, spikes=False, group="ddp"),
    run="ddp-eval",
    steps=80,
    check_every=5,
    args=(
        *("--straggler-rank", "3", "--straggler-sleep", "0.05"),
        *("--perturb-grad-rank", "1", "--flip-param-rank", "2", "--flip-param-step", "20"),
    ),
    faults=(
        ("ddp straggler (sleeps 50 ms)", "straggler", 3, {}),
        ("ddp sdc/canary", "sdc", 1, {"mode": "canary"}),
        ("ddp sdc/param", "sdc", 2, {"mode": "param"}),
    ),
    flip=(2, 20),
)
DDP_COMPUTE = DdpJob(
    spec=ScenarioSpec("ddp-compute", (), 0, 0.0, 1.0, noise_cv=0.0, spikes=False, group="ddp"),
    run="ddp-compute",
    steps=200,
    check_every=10,
    # 16,384 hidden units: ~16 ms of forward + backward per pass on one core, so the
    # straggler's second pass is real work competing for the same two cores (and a smaller
    # learning rate: at 0.05 so wide a layer diverges to NaN losses within 40 steps).
    args=(
        *("--straggler-rank", "2", "--straggler-repeat", "2"),
        *("--hidden", "16384", "--lr", "0.001"),
    ),
    faults=(("ddp straggler (computes 2x, 4 ranks on 2 cores)", "straggler", 2, {}),),
    pin_cores=PINNED_CORES,
)
DDP_JOBS = (DDP_FAULTS, DDP_COMPUTE)


def ddp_train(job: DdpJob, *, url: str, secret: str, workdir: Path) -> None:
    """Train `job` under torchrun against `url`; every rank's reports are delivered on exit."""
    token_file = workdir / f"{job.spec.name}.token"
    token_file.write_text(secret)
    token_file.chmod(0o600)
    command = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DDP_RANKS)),
        str(ROOT / "examples" / "ddp_train.py"),
        "--",  # torchrun would take --run for its own --run-path
        *("--server", url, "--token-file", str(token_file), "--run", job.run),
        *("--steps", str(job.steps), "--check-every", str(job.check_every)),
        *("--spool-dir", str(workdir / f"{job.spec.name}-spool")),
        *job.args,
    ]
    # torchrun gives each rank one thread (OMP_NUM_THREADS=1); pinning them all to the
    # same cores makes the ranks outnumber the cores, as on a crowded host.
    cores = sorted(os.sched_getaffinity(0))[: job.pin_cores] if job.pin_cores else None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with open(workdir / f"{job.spec.name}.log", "wb") as output:
        code = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=DDP_TIMEOUT_S,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        ).returncode
    if code != 0:
        raise RuntimeError(f"ddp_train exited {code}: see {workdir}/{job.spec.name}.log")


def ddp_scenario(job: DdpJob, *, cluster: Cluster) -> dict[str, Any]:
    """The scenario of a ddp job, built from its stored reports: when it started and ended,
    and its injected faults (a bit flip begins at its step's report)."""
    steps = StepReport.objects.filter(run__cluster=cluster, run__name=job.run)
    first, last = steps.order_by("ts").first(), steps.order_by("-ts").first()
    if first is None or last is None:
        raise RuntimeError(f"the ddp run {job.run} stored no step reports")
    base = first.ts.timestamp() - first.step_time
    faults = []
    for label, kind, rank, params in job.faults:
        start = base
        if job.flip is not None and job.flip[0] == rank and params.get("mode") == "param":
            flip = steps.filter(rank=rank, step=job.flip[1]).first()
            start = flip.ts.timestamp() if flip else base
        faults.append(
            {
                "fault": kind,
                "label": label,
                "subject": {"run": job.run, "rank": rank},
                "start_ts": start,
                "params": params,
            }
        )
    return {"base_ts": base, "end_ts": last.ts.timestamp() + 2 * DDP_STEP_S, "faults": faults}
