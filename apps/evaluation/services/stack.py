"""The live stack the scenarios post through, and replaying a stored scenario's alerts.

Replay: every `step_s` seconds of a scenario's own time the alerts service evaluates its
cluster as of that moment (`alerts_evaluate(as_of=True)`: the same detectors and alert
state machine as beat's), so alerts open and resolve with historical times.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.alerts.models import Alert, ClusterDetectorConfig, Incident
from apps.alerts.services import alerts_evaluate
from apps.clusters.models import Cluster
from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from apps.runs.models import Run
from apps.runs.selectors import run_goodput
from detectors.evaluation import AlertRecord, RunRecord
from detectors.incident_evaluation import IncidentRecord
from launcher.commands import server_commands
from launcher.procs import ROOT, children_stop, free_port, wait_for_http
from launcher.stack import service_env

DRAIN_TIMEOUT_S = 300


def scenario_replay(*, cluster: Cluster, scenario: dict[str, Any], step_s: float) -> int:
    """Evaluate the cluster every `step_s` seconds of the scenario's own time, as of then."""
    start, end = scenario["base_ts"], scenario["end_ts"]
    count = int((end - start) // step_s)
    for index in range(1, count + 1):
        alerts_evaluate(cluster=cluster, now=start + index * step_s, as_of=True)
    return count


def alert_records(*, cluster: Cluster) -> list[AlertRecord]:
    alerts = Alert.objects.filter(cluster=cluster).select_related("run", "node")
    return [_record(alert) for alert in alerts.order_by("opened_at", "id")]


def _record(alert: Alert) -> AlertRecord:
    return AlertRecord(
        kind=alert.kind,
        subject=alert.subject,
        opened_at=alert.opened_at.timestamp(),
        run=alert.run.name if alert.run_id else None,
        node=alert.node.name if alert.node_id else None,
        rank=alert.rank,
        gpu=alert.gpu,
        evidence=alert.evidence or {},
    )


def incident_records(*, cluster: Cluster) -> list[IncidentRecord]:
    """The cluster's incidents with their alerts (as `alert_records` has them), for the
    folding score."""
    by_incident: dict[int, list[AlertRecord]] = {}
    runs: dict[int, str | None] = {}
    alerts = Alert.objects.filter(cluster=cluster, incident__isnull=False)
    for alert in alerts.select_related("run", "node").order_by("opened_at", "id"):
        by_incident.setdefault(alert.incident_id, []).append(_record(alert))
        runs.setdefault(alert.incident_id, alert.run.name if alert.run_id else None)
    return [
        IncidentRecord(
            opened_at=incident.opened_at.timestamp(),
            root_kind=incident.root_kind or None,
            alerts=tuple(by_incident.get(incident.pk, ())),
            root_node=incident.root_node or None,
            root_gpu=incident.root_gpu,
            root_rank=incident.root_rank,
            run=runs.get(incident.pk),
        )
        for incident in Incident.objects.filter(cluster=cluster).order_by("opened_at", "id")
    ]


def run_records(*, cluster: Cluster, now: float) -> list[RunRecord]:
    """Each run's restarts and the recovery seconds of its goodput as of `now` (the
    scenario's end): the run summary's own figures."""
    records = []
    for run in Run.objects.filter(cluster=cluster).order_by("name"):
        goodput = run_goodput(run=run, now=now) or {"badput_s": {}}
        recovery = float(goodput["badput_s"].get("recovery", 0.0))
        records.append(RunRecord(run.name, run.restarts, recovery))
    return records


def cluster_prepare(name: str) -> tuple[Cluster, str]:
    """A fresh cluster for one scenario, beat paused for it, and an agent token."""
    token, secret = token_issue(cluster_name=name, name="evaluation")
    ClusterDetectorConfig.objects.update_or_create(cluster=token.cluster, defaults={"paused": True})
    return token.cluster, secret


def wait_for_drain(clusters: list[tuple[Cluster, str]]) -> None:
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
    """The live stack the scenarios are posted through: gunicorn, uvicorn (the agents'
    command long-polls) and one Celery worker on loopback (no beat: the replay drives the
    alerts), as `launcher.stack` starts them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.env, _ = service_env()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def start(self) -> EvaluationStack:
        ws_port = free_port()
        # the simulated agents' command long-polls are redirected there (LIVE_WS_PORT): held
        # by gunicorn's two sync workers instead, four simulated nodes starved every POST
        self.env["LIVE_WS_PORT"] = str(ws_port)
        commands = server_commands(
            host="127.0.0.1",
            port=self.port,
            ws_port=ws_port,
            web_workers=2,
            worker_concurrency=2,
            queue=settings.REDIS_PREFIX,
            beat_schedule=Path(tempfile.gettempdir()) / "opsboard-eval-beat",
        )
        for name in ("web", "ws", "worker"):
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
