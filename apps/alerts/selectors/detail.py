"""Reads of one alert's page: its timeline of state changes, how long it fired, and the
checksums behind a silent-data-corruption alert."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from statistics import median
from typing import Any

from apps.alerts.choices import AlertEvent, AlertKind, AlertState
from apps.alerts.models import Alert
from apps.audit.choices import AuditAction, Outcome
from apps.audit.models import AuditEntry
from apps.runs.selectors import step_reports
from detectors.common import rel_diff
from detectors.config import DEFAULT_CONFIG

TIMELINE_AUDIT_MAX = 50
SDC_STEPS_MAX = 10
CHECKSUM_FIELDS = ("grad_checksum", "param_checksum", "canary_norm")


def alert_audit_target(alert: Alert) -> str:
    """The audit log's `target` of an alert's entries (alert_acknowledge writes it)."""
    return f"alert:{alert.pk}"


def alert_timeline(*, alert: Alert) -> list[dict[str, Any]]:
    """The alert's state changes oldest first: opened, every acknowledgement and silence
    attempt of the audit log (who, the note or reason, refused ones too), ageing, resolved.
    {"at", "event", "actor", "note", "outcome"}. One query (the audit entries)."""
    entries = AuditEntry.objects.filter(
        cluster_id=alert.cluster_id, target=alert_audit_target(alert)
    ).order_by("at", "id")[:TIMELINE_AUDIT_MAX]
    events = [_event(alert.opened_at, AlertEvent.OPENED)]
    acknowledged_in_log = False
    for entry in entries:
        succeeded = entry.outcome == Outcome.SUCCEEDED
        if entry.action == AuditAction.ALERT_SILENCE:
            event = AlertEvent.SILENCED if succeeded else f"silence {entry.outcome}"
        else:
            acknowledged_in_log |= succeeded
            event = AlertEvent.ACKNOWLEDGED if succeeded else f"acknowledgement {entry.outcome}"
        events.append(
            _event(
                entry.at, event, actor=entry.actor_name, note=entry.reason, outcome=entry.outcome
            )
        )
    if alert.acknowledged_at and not acknowledged_in_log:
        by = alert.acknowledged_by.get_username() if alert.acknowledged_by else ""
        events.append(_event(alert.acknowledged_at, AlertEvent.ACKNOWLEDGED, by, alert.ack_note))
    if alert.aged_at:  # unacknowledged past its cluster's warning_age_min
        events.append(_event(alert.aged_at, AlertEvent.AGEING))
    if alert.resolved_at:
        events.append(_event(alert.resolved_at, AlertEvent.RESOLVED))
    return sorted(events, key=lambda e: e["at"])


def _event(
    at: datetime, event: str, actor: str = "", note: str = "", outcome: str = Outcome.SUCCEEDED
) -> dict[str, Any]:
    return {"at": at, "event": str(event), "actor": actor, "note": note, "outcome": outcome}


def alert_duration(*, alert: Alert, now: float) -> dict[str, Any]:
    """How long the alert has fired ("firing for", open: since it opened until now) or fired
    ("resolved after"), in whole minutes; and the seconds."""
    end = alert.resolved_at.timestamp() if alert.resolved_at else now
    seconds = max(0.0, end - alert.opened_at.timestamp())
    open_ = alert.state != AlertState.RESOLVED
    return {
        "seconds": seconds,
        "minutes": int(seconds // 60),
        "text": f"{'firing for' if open_ else 'resolved after'} {duration_text(seconds)}",
    }


def duration_text(seconds: float) -> str:
    """ "less than a minute", "7 min", "2 h 5 min", "3 d 4 h"."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "less than a minute"
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min"
    return f"{hours // 24} d {hours % 24} h"


def sdc_checksums(*, alert: Alert) -> list[dict[str, Any]]:
    """Per step the SDC alert names (evidence.steps, newest SDC_STEPS_MAX), the suspect rank's
    and its named peers' checksums beside the majority's of the other ranks of its shard:
    {"step", "rows": [{"label", "rank", "grad_checksum", "param_checksum", "canary_norm",
    "differs": [field, …]}]}, the majority row last. One query."""
    evidence = alert.evidence if isinstance(alert.evidence, dict) else {}
    steps = [s for s in evidence.get("steps") or [] if isinstance(s, int)][-SDC_STEPS_MAX:]
    if alert.kind != AlertKind.SDC or alert.run_id is None or alert.rank is None or not steps:
        return []
    suspects = {alert.rank, *(p for p in evidence.get("peers") or [] if isinstance(p, int))}
    shard = evidence.get("shard") or None
    reports = step_reports(  # raw and compacted alike: an old alert's steps may be compacted
        run_id=alert.run_id,
        fields=("step", "rank", "shard", *CHECKSUM_FIELDS),
        step_lo=min(steps),
        step_hi=max(steps),
    )
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in reports:
        if row["step"] in steps and row.pop("shard") == shard:
            by_step.setdefault(row["step"], []).append(row)
    return [_step_table(step, by_step[step], suspects) for step in steps if step in by_step]


def _step_table(step: int, rows: list[dict[str, Any]], suspects: set[int]) -> dict[str, Any]:
    others = [r for r in rows if r["rank"] not in suspects]
    majority = {f: _most_common([r[f] for r in others]) for f in CHECKSUM_FIELDS[:2]}
    norms = [r["canary_norm"] for r in others if r["canary_norm"] is not None]
    majority["canary_norm"] = median(norms) if norms else None
    table = [
        {"label": f"rank {r['rank']}", "rank": r["rank"], **{f: r[f] for f in CHECKSUM_FIELDS},
         "differs": _differs(r, majority) if others else []}
        for r in rows if r["rank"] in suspects
    ]  # fmt: skip
    if others:
        label = f"majority of the other {len(others)} rank{'s' if len(others) != 1 else ''}"
        table.append({"label": label, "rank": None, **majority, "differs": []})
    return {"step": step, "rows": table}


def _differs(row: dict[str, Any], majority: dict[str, Any]) -> list[str]:
    """The fields in which a rank differs from the majority: checksums exactly, the canary's
    norm beyond the detectors' relative tolerance (detectors.sdc's rule)."""
    differs = [f for f in CHECKSUM_FIELDS[:2] if row[f] != majority[f]]
    norm, usual = row["canary_norm"], majority["canary_norm"]
    if (
        norm is not None
        and usual is not None
        and rel_diff(norm, usual) > DEFAULT_CONFIG.sdc_canary_rtol
    ):
        differs.append("canary_norm")
    return differs


def _most_common(values: list[Any]) -> Any:
    counted = Counter(v for v in values if v is not None)
    return counted.most_common(1)[0][0] if counted else None
