"""Score incident folding against the faults a scenario injected (`make evaluate`).

For every injected fault exactly one incident should open with the right root cause: its
root of a kind that finds the fault (detectors.evaluation.EXPECTED) naming the fault's
subject, and no other incident rooted at one of the fault's consequences (a straggler at
the throttled GPU's rank opened as an incident of its own splits the fault in two). Two
faults at once stay two incidents: an incident holding the finding alerts of two faults is
a false fold, and so, on a fault-free run, is any incident that folded more than one alert
(nothing there shares a cause).

Pure: incidents are plain `IncidentRecord`s, their alerts the evaluation's `AlertRecord`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detectors.evaluation import CLOCK_SLACK_S, EXPECTED, AlertRecord, fault_label, names_subject


@dataclass(frozen=True)
class IncidentRecord:
    opened_at: float
    root_kind: str | None  # None: unknown
    alerts: tuple[AlertRecord, ...]
    root_node: str | None = None
    root_gpu: int | None = None
    root_rank: int | None = None
    run: str | None = None  # the run of its alerts, when they name one


@dataclass(frozen=True)
class FoldScore:
    label: str
    incidents: int  # incidents opened with a root that finds the fault
    right: bool  # exactly one, and no incident rooted at a consequence of the fault
    split: int = 0  # incidents rooted at a consequence of the fault, not folded under it


@dataclass(frozen=True)
class FoldingScore:
    faults: tuple[FoldScore, ...]
    false_folds: int


def _root_as_alert(incident: IncidentRecord) -> AlertRecord:
    """The root's own alert (its evidence counts, an SDC's cause), or its place alone."""
    for alert in incident.alerts:
        place = (alert.kind, alert.node, alert.gpu, alert.rank)
        if place == (incident.root_kind, incident.root_node, incident.root_gpu, incident.root_rank):
            return alert
    return AlertRecord(
        kind=incident.root_kind or "",
        subject="",
        opened_at=incident.opened_at,
        run=incident.run,
        node=incident.root_node,
        rank=incident.root_rank,
        gpu=incident.root_gpu,
    )


def _finds(fault: Mapping[str, Any], alert: AlertRecord) -> bool:
    expect = EXPECTED[fault["fault"]]
    return (
        alert.opened_at >= fault["start_ts"] - CLOCK_SLACK_S
        and alert.kind in expect.kinds
        and names_subject(alert, fault["subject"], expect.names)
        and (expect.evidence is None or expect.evidence(alert.evidence, fault.get("params", {})))
    )


def _follows(fault: Mapping[str, Any], root: AlertRecord) -> bool:
    """The root is one of the fault's consequences (EXPECTED's), opened after the fault
    began, in its run, contradicting none of its subject's fields."""
    return (
        root.opened_at >= fault["start_ts"] - CLOCK_SLACK_S
        and root.kind in EXPECTED[fault["fault"]].consequences
        and names_subject(root, fault["subject"], "run")
    )


def score_folding(scenario: Mapping[str, Any], incidents: Iterable[IncidentRecord]) -> FoldingScore:
    """How the scenario's incidents folded its faults (module docstring)."""
    incidents = list(incidents)
    faults = [f for f in scenario.get("faults", []) if EXPECTED[f["fault"]].kinds]
    scores = []
    for fault in faults:
        roots = [_root_as_alert(i) for i in incidents if i.root_kind]
        rooted = sum(_finds(fault, root) for root in roots)
        split = sum(_follows(fault, root) for root in roots)
        scores.append(FoldScore(fault_label(fault), rooted, rooted == 1 and not split, split))
    false_folds = 0
    for incident in incidents:
        if not faults:
            false_folds += len(incident.alerts) > 1
            continue
        found = {
            i for i, fault in enumerate(faults) if any(_finds(fault, a) for a in incident.alerts)
        }
        false_folds += len(found) > 1
    return FoldingScore(tuple(scores), false_folds)


@dataclass(frozen=True)
class FoldRow:
    label: str
    scenarios: int
    right: int
    false_folds: int
    split: int = 0  # consequences opened as incidents of their own


def summarize_folding(scored: Sequence[FoldingScore]) -> list[FoldRow]:
    """One row per fault label across seeds, and "clean" for the fault-free runs."""
    groups: dict[str, list[tuple[FoldScore | None, FoldingScore]]] = {}
    for score in scored:
        if not score.faults:
            groups.setdefault("clean", []).append((None, score))
        for fault in score.faults:
            groups.setdefault(fault.label, []).append((fault, score))
    rows = []
    for label, items in groups.items():
        # a scenario's false folds count once per row (it may hold two faults of one label)
        seen: set[int] = set()
        folds = 0
        for _, score in items:
            if id(score) not in seen:
                seen.add(id(score))
                folds += score.false_folds
        right = sum(1 for fault, _ in items if fault is not None and fault.right)
        split = sum(fault.split for fault, _ in items if fault is not None)
        rows.append(FoldRow(label, len(items), right, folds, split))
    return sorted(rows, key=lambda row: (row.label == "clean", row.label))


def format_folding(rows: Sequence[FoldRow]) -> str:
    """A Markdown table: per fault, the runs where exactly one incident opened with the
    right root cause, the false folds, and the consequences split off as incidents of their own."""
    lines = [
        "| fault | faults (clean: runs) | one incident, right root | false folds | split off |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        right = "—" if row.label == "clean" else f"{row.right}/{row.scenarios}"
        lines.append(
            f"| {row.label} | {row.scenarios} | {right} | {row.false_folds} | {row.split} |"
        )
    return "\n".join(lines)
