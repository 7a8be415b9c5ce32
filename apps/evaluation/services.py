"""The detector evaluation: simulated faults through a live stack, replayed, scored.

1. Each scenario gets a cluster of its own (continuous evaluation paused, so beat keeps
   out of it) and an agent token; the simulator (`opsboard_agent.sim`, the real agent code)
   posts it through the ingest API of a live stack (gunicorn + a Celery worker) faster
   than real time, and writes its scenario JSON: what was injected, where and when.
2. Once the worker has stored everything, the scenario is replayed: every `step_s`
   simulated seconds the alerts service evaluates the cluster as of that moment
   (`alerts_evaluate(as_of=True)`, the same detectors and alert state machine as beat's).
3. The alerts it opened are scored against the scenario (`detectors.evaluation`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.alerts.models import Alert, ClusterDetectorConfig
from apps.alerts.services import alerts_evaluate
from apps.clusters.models import Cluster
from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from apps.runs.models import StepReport
from detectors.evaluation import AlertRecord, ScenarioScore, score_scenario
from opsboard.stack import (
    ROOT,
    children_stop,
    free_port,
    server_commands,
    service_env,
    wait_for_http,
)

NODES, GPUS = 2, 8  # one run of 16 ranks
SIM_TIMEOUT_S = 900
DRAIN_TIMEOUT_S = 300

# Per fault label: (the --fault spec for seed s, simulated seconds to play). Subjects and
# start times move with the seed, so a detector cannot be right by always naming one rank.
FAULTS: dict[str, tuple[Callable[[int], str], float]] = {
    "straggler": (lambda s: f"straggler:rank={(5 * s + 2) % 16},at={50 + 10 * s}", 300),
    "sdc/canary": (lambda s: f"sdc:rank={(3 * s + 1) % 16},mode=canary,at={50 + 10 * s}", 240),
    "sdc/param": (lambda s: f"sdc:rank={(7 * s + 4) % 16},mode=param,at={50 + 10 * s}", 240),
    "input-bound": (lambda s: f"input-bound:node={s % NODES},at={50 + 10 * s}", 300),
    "hang": (lambda s: f"hang:at={50 + 10 * s}", 360),
    "thermal": (lambda s: f"thermal:node={s % NODES},gpu={(3 * s + 1) % 8},at={50 + 10 * s}", 300),
    "xid": (
        lambda s: (
            f"xid:node={s % NODES},gpu={(5 * s) % 8},at={50 + 10 * s},code={(79, 48, 94)[s % 3]}"
        ),
        200,
    ),
    "node-loss": (lambda s: f"node-loss:node={s % NODES},at={50 + 10 * s}", 240),
    "nfs-drop": (lambda s: f"nfs-drop:at={10 * s},stall={40 + 10 * s}", 400),
    "fabric": (lambda s: f"fabric:at={50 + 10 * s},factor=3,ramp=30", 360),
    "oom-creep": (lambda s: f"oom-creep:rank={(11 * s + 3) % 16},at={50 + 10 * s},ramp=120", 300),
}


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    faults: tuple[str, ...]
    seed: int
    duration: float
    speed: float


@dataclass
class ScenarioResult:
    spec: ScenarioSpec
    cluster: str
    scenario: dict[str, Any]
    score: ScenarioScore
    evaluations: int
    replay_s: float


def scenario_specs(
    *,
    labels: list[str] | None = None,
    seeds: tuple[int, ...] = (1, 2, 3),
    clean_s: float = 7200.0,
    speed: float = 20.0,
    clean_speed: float = 60.0,
) -> list[ScenarioSpec]:
    """Every fault label (or `labels`) × `seeds`, plus one clean run of `clean_s` seconds
    (none when 0)."""
    specs = [
        ScenarioSpec(f"{label.replace('/', '-')}-s{seed}", (spec(seed),), seed, duration, speed)
        for label in labels or list(FAULTS)
        for spec, duration in [FAULTS[label]]
        for seed in seeds
    ]
    if clean_s:
        specs.append(ScenarioSpec("clean", (), 42, clean_s, clean_speed))
    return specs


def evaluation_run(
    *,
    specs: list[ScenarioSpec],
    server: str | None = None,
    parallel: int = 3,
    step_s: float = 5.0,
    workdir: Path | None = None,
    ddp: bool = False,
    log: Callable[[str], None] = print,
) -> list[ScenarioResult]:
    """Play, replay and score every scenario (and, with `ddp`, examples/ddp_train.py on 4
    gloo ranks with its three faults). Without `server`, starts its own live stack (web +
    Celery worker on loopback) against this process's database and stops it after."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="opsboard-eval-"))
    stamp = time.strftime("%m%d%H%M%S")
    if ddp:
        specs = [*specs, DDP_SPEC]
    clusters = {spec.name: _cluster_prepare(f"eval-{stamp}-{spec.name}") for spec in specs}
    stack = None if server else EvaluationStack(log_dir=workdir).start()
    try:
        url = server or stack.url  # type: ignore[union-attr]
        _simulate(
            [spec for spec in specs if spec is not DDP_SPEC], clusters, url, workdir, parallel, log
        )
        if ddp:
            ddp_train(url=url, secret=clusters[DDP_SPEC.name][1], workdir=workdir)
            log("trained ddp")
        _wait_for_drain(list(clusters.values()))
    finally:
        if stack is not None:
            stack.stop()
    results = []
    for spec in specs:
        cluster, _ = clusters[spec.name]
        if spec is DDP_SPEC:
            scenario, every = ddp_scenario(cluster=cluster), DDP_STEP_S
        else:
            scenario = json.loads((workdir / f"{spec.name}.json").read_text())
            every = step_s
        started = time.monotonic()
        evaluations = scenario_replay(cluster=cluster, scenario=scenario, step_s=every)
        score = score_scenario(scenario, alert_records(cluster=cluster))
        results.append(
            ScenarioResult(
                spec, cluster.name, scenario, score, evaluations, time.monotonic() - started
            )
        )
        log(f"replayed {spec.name}: {evaluations} evaluations in {results[-1].replay_s:.1f} s")
    return results


# examples/ddp_train.py on 4 CPU ranks (gloo): rank 3 sleeps in its compute phase, rank 1's
# hook perturbs its local gradients at every step, and rank 2 flips one bit of a weight.
DDP_SPEC = ScenarioSpec("ddp", (), 0, 0.0, 1.0)
DDP_RUN, DDP_RANKS, DDP_STEPS, DDP_CHECK_EVERY = "ddp-eval", 4, 80, 5
DDP_STRAGGLER, DDP_SLEEP_S, DDP_PERTURB, DDP_FLIP, DDP_FLIP_STEP = 3, 0.05, 1, 2, 20
DDP_STEP_S = 0.5  # the run lasts seconds: evaluate twice a second of it


def ddp_train(*, url: str, secret: str, workdir: Path) -> None:
    """Train under torchrun against `url`; every rank's reports are delivered on exit."""
    token_file = workdir / "ddp.token"
    token_file.write_text(secret)
    token_file.chmod(0o600)
    command = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DDP_RANKS)),
        str(ROOT / "examples" / "ddp_train.py"),
        "--",  # torchrun would take --run for its own --run-path
        *("--server", url, "--token-file", str(token_file), "--run", DDP_RUN),
        *("--steps", str(DDP_STEPS), "--check-every", str(DDP_CHECK_EVERY)),
        *("--spool-dir", str(workdir / "ddp-spool")),
        *("--straggler-rank", str(DDP_STRAGGLER), "--straggler-sleep", str(DDP_SLEEP_S)),
        *("--perturb-grad-rank", str(DDP_PERTURB)),
        *("--flip-param-rank", str(DDP_FLIP), "--flip-param-step", str(DDP_FLIP_STEP)),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(workdir / "ddp.log", "wb") as output:
        code = subprocess.run(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=600
        ).returncode
    if code != 0:
        raise RuntimeError(f"ddp_train exited {code}: see {workdir}/ddp.log")


def ddp_scenario(*, cluster: Cluster) -> dict[str, Any]:
    """The scenario of the ddp run, built from its stored reports: when it started and
    ended, and the three injected faults (the flip begins at its step's report)."""
    steps = StepReport.objects.filter(run__cluster=cluster, run__name=DDP_RUN)
    first, last = steps.order_by("ts").first(), steps.order_by("-ts").first()
    if first is None or last is None:
        raise RuntimeError("the ddp run stored no step reports")
    base = first.ts.timestamp() - first.step_time
    flip = steps.filter(rank=DDP_FLIP, step=DDP_FLIP_STEP).first()
    flip_ts = flip.ts.timestamp() if flip else base

    def fault(label: str, kind: str, rank: int, start: float, **params: Any) -> dict[str, Any]:
        subject = {"run": DDP_RUN, "rank": rank}
        return {
            "fault": kind,
            "label": label,
            "subject": subject,
            "start_ts": start,
            "params": params,
        }

    return {
        "base_ts": base,
        "end_ts": last.ts.timestamp() + 2 * DDP_STEP_S,
        "faults": [
            fault("ddp straggler", "straggler", DDP_STRAGGLER, base),
            fault("ddp sdc/canary", "sdc", DDP_PERTURB, base, mode="canary"),
            fault("ddp sdc/param", "sdc", DDP_FLIP, flip_ts, mode="param"),
        ],
    }


def scenario_replay(*, cluster: Cluster, scenario: dict[str, Any], step_s: float) -> int:
    """Evaluate the cluster every `step_s` seconds of the scenario's own time, as of then."""
    start, end = scenario["base_ts"], scenario["end_ts"]
    count = int((end - start) // step_s)
    for index in range(1, count + 1):
        alerts_evaluate(cluster=cluster, now=start + index * step_s, as_of=True)
    return count


def alert_records(*, cluster: Cluster) -> list[AlertRecord]:
    alerts = Alert.objects.filter(cluster=cluster).select_related("run", "node")
    return [
        AlertRecord(
            kind=alert.kind,
            subject=alert.subject,
            opened_at=alert.opened_at.timestamp(),
            run=alert.run.name if alert.run_id else None,
            node=alert.node.name if alert.node_id else None,
            rank=alert.rank,
            gpu=alert.gpu,
            evidence=alert.evidence or {},
        )
        for alert in alerts.order_by("opened_at", "id")
    ]


def _cluster_prepare(name: str) -> tuple[Cluster, str]:
    """A fresh cluster for one scenario, beat paused for it, and an agent token."""
    token, secret = token_issue(cluster_name=name, name="evaluation")
    ClusterDetectorConfig.objects.update_or_create(cluster=token.cluster, defaults={"paused": True})
    return token.cluster, secret


def _sim_command(spec: ScenarioSpec, url: str, token_file: Path, out: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "opsboard_agent.sim",
        *("--server", url, "--token-file", str(token_file)),
        *("--nodes", str(NODES), "--gpus", str(GPUS), "--seed", str(spec.seed)),
        *("--duration", str(spec.duration), "--speed", str(spec.speed)),
        *("--scenario-out", str(out), "--drain-timeout", "120"),
    ]
    for fault in spec.faults:
        command += ["--fault", fault]
    return command


def _simulate(
    specs: list[ScenarioSpec],
    clusters: dict[str, tuple[Cluster, str]],
    url: str,
    workdir: Path,
    parallel: int,
    log: Callable[[str], None],
) -> None:
    """Run the simulators, `parallel` at a time; every one must deliver everything."""
    waiting = list(specs)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                spec = waiting.pop(0)
                running[spec.name] = (_sim_start(spec, clusters, url, workdir), time.monotonic())
            for name, (process, started) in list(running.items()):
                try:
                    code = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started > SIM_TIMEOUT_S:
                        raise RuntimeError(f"simulator {name} ran past {SIM_TIMEOUT_S} s") from None
                    continue
                del running[name]
                if code != 0:
                    raise RuntimeError(f"simulator {name} exited {code}: see {workdir}/{name}.log")
                log(f"simulated {name}")
    finally:
        children_stop(process for process, _ in running.values())


def _sim_start(
    spec: ScenarioSpec, clusters: dict[str, tuple[Cluster, str]], url: str, workdir: Path
) -> subprocess.Popen:
    token_file = workdir / f"{spec.name}.token"
    token_file.write_text(clusters[spec.name][1])
    token_file.chmod(0o600)
    command = _sim_command(spec, url, token_file, workdir / f"{spec.name}.json")
    with open(workdir / f"{spec.name}.log", "wb") as output:
        return subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)


def _wait_for_drain(clusters: list[tuple[Cluster, str]]) -> None:
    """Until the worker has stored every batch the scenarios' agents posted."""
    cluster_ids = [cluster.pk for cluster, _ in clusters]
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    pending = InboxBatch.objects.filter(
        token__cluster_id__in=cluster_ids, processed_at__isnull=True
    )
    while pending.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pending.count()} batches still unstored after the timeout")
        time.sleep(0.5)


class EvaluationStack:
    """The live stack the scenarios are posted through: gunicorn and one Celery worker on
    loopback (no beat: the replay drives the alerts), as `opsboard.stack` starts them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.env, _ = service_env()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def start(self) -> EvaluationStack:
        commands = server_commands(
            host="127.0.0.1",
            port=self.port,
            ws_port=free_port(),
            web_workers=2,
            worker_concurrency=2,
            queue=settings.REDIS_PREFIX,
            beat_schedule=Path(tempfile.gettempdir()) / "opsboard-eval-beat",
        )
        for name in ("web", "worker"):
            with open(self.log_dir / f"{name}.log", "ab") as output:
                self.processes.append(
                    subprocess.Popen(
                        commands[name], cwd=ROOT, env=self.env, stdout=output, stderr=output
                    )
                )
        try:
            wait_for_http(f"{self.url}/healthz", give_up=lambda: False, timeout=60)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        children_stop(self.processes, timeout=20)
