"""The detector evaluation: simulated faults (under noise) and real DDP jobs through a live
stack, replayed, scored.

1. Each scenario gets a cluster of its own (continuous evaluation paused, so beat keeps
   out of it) and an agent token; the simulator (`opsboard_agent.sim`, the real agent code)
   posts it through the ingest API of a live stack (gunicorn + a Celery worker) faster
   than real time, with its noise model at the scenario's level, and writes its scenario
   JSON: what was injected, where and when. examples/ddp_train.py jobs (`ddp`) post the
   same way under torchrun.
2. Once the worker has stored everything, the scenario is replayed (`stack.scenario_replay`).
3. The alerts it opened are scored against the scenario (`detectors.evaluation`).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.alerts.models import Alert, Incident
from apps.clusters.models import Cluster
from apps.evaluation.services.ddp import DDP_COMPUTE, DDP_JOBS, DDP_STEP_S, DdpJob, ddp_scenario
from apps.evaluation.services.ddp import ddp_train as ddp_train
from apps.evaluation.services.scenarios import (
    EARLIER_SUFFIX,
    FAULTS,
    LABELS,
    NOISE_LEVELS,
    ScenarioSpec,
    demo_specs,
    scenario_specs,
    sensitivity_specs,
    simulate,
)
from apps.evaluation.services.stack import (
    EvaluationStack,
    alert_records,
    cluster_prepare,
    incident_records,
    run_records,
    scenario_replay,
    wait_for_drain,
)
from detectors.evaluation import ScenarioScore, score_scenario
from detectors.incident_evaluation import FoldingScore, score_folding

CLUSTERS_FILE = "clusters.json"

__all__ = [
    "DDP_COMPUTE",
    "DDP_JOBS",
    "FAULTS",
    "LABELS",
    "NOISE_LEVELS",
    "ScenarioResult",
    "ScenarioSpec",
    "demo_specs",
    "evaluation_replay",
    "evaluation_run",
    "scenario_specs",
    "sensitivity_specs",
]


@dataclass
class ScenarioResult:
    spec: ScenarioSpec
    cluster: str
    scenario: dict[str, Any]
    score: ScenarioScore
    evaluations: int
    replay_s: float
    folding: FoldingScore | None = None  # how its incidents folded its faults


def evaluation_run(
    *,
    specs: list[ScenarioSpec],
    server: str | None = None,
    parallel: int = 3,
    workdir: Path | None = None,
    ddp: tuple[DdpJob, ...] | bool = False,
    log: Callable[[str], None] = print,
) -> list[ScenarioResult]:
    """Play, replay and score every scenario, and the ddp jobs `ddp` (True: all of them).
    Without `server`, starts its own live stack (web + Celery worker on loopback) against
    this process's database and stops it after."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="opsboard-eval-"))
    stamp = time.strftime("%m%d%H%M%S")
    jobs = DDP_JOBS if ddp is True else tuple(ddp or ())
    every = [*specs, *(job.spec for job in jobs)]
    clusters = {spec.name: cluster_prepare(f"eval-{stamp}-{spec.name}") for spec in every}
    # Which cluster holds which scenario, so `evaluation_replay` can judge them again.
    names = {name: cluster.name for name, (cluster, _) in clusters.items()}
    (workdir / CLUSTERS_FILE).write_text(json.dumps(names, indent=1) + "\n")
    stack = None if server else EvaluationStack(log_dir=workdir).start()
    try:
        url = server or stack.url  # type: ignore[union-attr]
        simulate(specs, clusters, url, workdir, parallel, log)
        for job in jobs:
            ddp_train(job, url=url, secret=clusters[job.spec.name][1], workdir=workdir)
            log(f"trained {job.spec.name}")
        wait_for_drain(list(clusters.values()))
    finally:
        if stack is not None:
            stack.stop()
    return _replay_all(specs, jobs, {name: c for name, (c, _) in clusters.items()}, workdir, log)


def evaluation_replay(
    *,
    specs: list[ScenarioSpec],
    workdir: Path,
    ddp: tuple[DdpJob, ...] = (),
    log: Callable[[str], None] = print,
) -> list[ScenarioResult]:
    """Judge the scenarios an earlier `evaluation_run` stored (same `specs` and `ddp`, its
    `workdir`) again, from scratch: their alerts are deleted and every moment replayed —
    after a detector change, without simulating again."""
    names = json.loads((workdir / CLUSTERS_FILE).read_text())
    every = [*specs, *(job.spec for job in ddp)]
    clusters = {spec.name: Cluster.objects.get(name=names[spec.name]) for spec in every}
    Alert.objects.filter(cluster__in=clusters.values()).delete()
    Incident.objects.filter(cluster__in=clusters.values()).delete()
    return _replay_all(specs, ddp, clusters, workdir, log)


def _replay_all(
    specs: list[ScenarioSpec],
    jobs: tuple[DdpJob, ...],
    clusters: dict[str, Cluster],
    workdir: Path,
    log: Callable[[str], None],
) -> list[ScenarioResult]:
    scenarios = {spec.name: _scenario_load(spec, workdir) for spec in specs}
    for job in jobs:
        scenarios[job.spec.name] = ddp_scenario(job, cluster=clusters[job.spec.name])
    results = []
    for spec in [*specs, *(job.spec for job in jobs)]:
        cluster = clusters[spec.name]
        scenario = scenarios[spec.name]
        started = time.monotonic()
        step_s = DDP_STEP_S if spec.group == "ddp" else spec.step_s
        evaluations = scenario_replay(cluster=cluster, scenario=scenario, step_s=step_s)
        runs = run_records(cluster=cluster, now=scenario["end_ts"])
        score = score_scenario(scenario, alert_records(cluster=cluster), runs)
        folding = score_folding(scenario, incident_records(cluster=cluster))
        replay_s = time.monotonic() - started
        results.append(
            ScenarioResult(spec, cluster.name, scenario, score, evaluations, replay_s, folding)
        )
        log(f"replayed {spec.name}: {evaluations} evaluations in {replay_s:.1f} s")
    return results


def _scenario_load(spec: ScenarioSpec, workdir: Path) -> dict[str, Any]:
    """The simulator's scenario JSON, its faults labelled with the spec's row if it has one.
    Only the faults that began within the played time count (the demo's reach past its
    first ten minutes); after a restart, the earlier session's too: they happened, and
    their alerts may still be open."""
    scenario = json.loads((workdir / f"{spec.name}.json").read_text())
    faults = [f for f in scenario["faults"] if f["at"] <= scenario["duration"]]
    if spec.earlier_s > 0:
        earlier = json.loads((workdir / f"{spec.name}{EARLIER_SUFFIX}.json").read_text())
        faults = [f for f in earlier["faults"] if f["at"] <= earlier["duration"]] + faults
    scenario["faults"] = faults
    if spec.label:
        for fault in scenario["faults"]:
            fault["label"] = spec.label
    return scenario
