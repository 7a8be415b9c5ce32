"""Score alerts against the faults a scenario injected (the evaluation harness's measure).

Pure: a scenario is the simulator's scenario JSON (`opsboard_agent.sim.scenario`), alerts
are plain `AlertRecord`s. Per fault, the alert that *finds* it is the first one of an
expected kind that names the fault's subject (its run, node, rank, GPU) and, where the kind
says more (SDC), carries the right evidence. Alerts that follow from the fault without
naming it wrongly (a hot GPU also makes its rank a straggler; a lost node hangs its run)
are *consequences*. Every other alert is a false alarm, and so is any alert opened before
the first fault began.

A `resume` (a job that crashed and started again from its checkpoint) is no fault to alert
on: it is found when the server counted the restart and booked the lost steps as recovery
(`RunRecord`), and any alert about it (a `hang` while the run progresses) is a false alarm.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from detectors.sdc import CAUSES as SDC_CAUSES

SUBJECT_FIELDS = ("run", "node", "rank", "gpu")
# Stored times are rounded to the microsecond: an alert opened at the very instant a fault
# began may read as a hair earlier.
CLOCK_SLACK_S = 1e-3
# A resume is booked when the recovery seconds reach this share of its lost steps' wall
# time (the server takes medians over ranks; the simulator knows rank 0's times).
RECOVERY_BOOKED_SHARE = 0.9


@dataclass(frozen=True)
class AlertRecord:
    kind: str
    subject: str
    opened_at: float
    run: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """What the server made of a run once its scenario was played: the restarts it counted
    and the recovery seconds its goodput booked."""

    run: str
    restarts: int
    recovery_s: float


@dataclass(frozen=True)
class Expectation:
    """What finds a fault kind: alert kinds, the subject field that must be named, the
    kinds that may follow from it, and (optionally) a test of the evidence."""

    kinds: tuple[str, ...]
    names: str  # "rank", "gpu", "node" or "run": the most specific field the alert must name
    consequences: tuple[str, ...] = ()
    evidence: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None
    # The wait the detector's own definition imposes before it may fire (for the table).
    defined_wait: str = ""


def _sdc_cause(evidence: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    # mode=param flips weights: the replica's parameter checksum diverges; mode=canary
    # perturbs the gradients that GPU computes: its canary disagrees, weights still agree.
    wanted = "param_checksum" if params.get("mode") == "param" else "canary"
    return evidence.get("cause") == SDC_CAUSES[wanted]


EXPECTED: dict[str, Expectation] = {
    "straggler": Expectation(("straggler",), "rank", defined_wait="a 20-step window"),
    "sdc": Expectation(("sdc",), "rank", evidence=_sdc_cause, defined_wait="next check"),
    "oom-creep": Expectation(("oom_risk", "oom"), "gpu", consequences=("hang",)),
    "thermal": Expectation(
        ("thermal",), "gpu", ("straggler",), defined_wait=">85 °C, 80 % of 30 s"
    ),
    "xid": Expectation(("xid",), "gpu"),
    "input-bound": Expectation(("input_bound",), "node", defined_wait="20 steps"),
    "node-loss": Expectation(("heartbeat",), "node", ("hang",), defined_wait="30 s silent"),
    "hang": Expectation(("hang",), "run", defined_wait="120 s without a step"),
    "nfs-drop": Expectation(("checkpoint_upload",), "run", ("checkpoint_stale",)),
    "fabric": Expectation(("fabric",), "run", defined_wait="20 steps"),
    # no alert finds it: the run's restart count and goodput do (see _resume_booked)
    "resume": Expectation((), "run", defined_wait="none: no alert, a restart"),
}


@dataclass(frozen=True)
class FaultScore:
    fault: str
    label: str  # the fault kind, with its mode where it has one ("sdc/param")
    found: bool
    culprit_right: bool  # an expected-kind alert appeared and it named the right subject
    time_to_detect: float | None  # seconds from injection to the finding alert's opening


@dataclass(frozen=True)
class ScenarioScore:
    faults: tuple[FaultScore, ...]
    false_alarms: tuple[AlertRecord, ...]
    consequences: tuple[AlertRecord, ...]


def names_subject(alert: AlertRecord, subject: Mapping[str, Any], names: str) -> bool:
    """The alert names the fault's subject: it names the `names` field (a GPU may be named
    by its rank, and a rank by its node and GPU) and no named field contradicts it."""
    for key in SUBJECT_FIELDS:
        value = getattr(alert, key)
        if value is not None and key in subject and value != subject[key]:
            return False
    if names == "rank":
        return alert.rank is not None or (alert.node is not None and alert.gpu is not None)
    if names == "gpu":
        return (alert.node is not None and alert.gpu is not None) or alert.rank is not None
    return getattr(alert, names) is not None


def fault_label(fault: Mapping[str, Any]) -> str:
    """The row a fault is counted in: its own "label" if it has one, else kind[/mode]."""
    if fault.get("label"):
        return str(fault["label"])
    mode = fault.get("params", {}).get("mode")
    return f"{fault['fault']}/{mode}" if mode else str(fault["fault"])


def _finders(fault: Mapping[str, Any], alerts: Sequence[AlertRecord]) -> list[int]:
    """Indexes of the alerts (oldest first) that find `fault`: an expected kind, opened
    after it began, naming its subject, with the expected evidence."""
    expect = EXPECTED[fault["fault"]]
    subject, params = fault["subject"], fault.get("params", {})
    return [
        index
        for index, alert in enumerate(alerts)
        if alert.opened_at >= fault["start_ts"] - CLOCK_SLACK_S
        and alert.kind in expect.kinds
        and names_subject(alert, subject, expect.names)
        and (expect.evidence is None or expect.evidence(alert.evidence, params))
    ]


def _resume_booked(fault: Mapping[str, Any], runs: Mapping[str, RunRecord]) -> bool:
    """The server counted the resume's restart and booked its lost steps as recovery."""
    record = runs.get(fault["subject"].get("run", ""))
    return (
        record is not None
        and record.restarts >= 1
        and record.recovery_s >= RECOVERY_BOOKED_SHARE * float(fault.get("lost_s", 0.0))
    )


def score_scenario(
    scenario: Mapping[str, Any],
    alerts: Iterable[AlertRecord],
    runs: Iterable[RunRecord] = (),
) -> ScenarioScore:
    """Score one replayed scenario's alerts (and, for a `resume`, its `runs`) against its
    injected faults."""
    by_run = {record.run: record for record in runs}
    alerts = sorted(alerts, key=lambda alert: alert.opened_at)
    faults = scenario.get("faults", [])
    first_fault = min((f["start_ts"] for f in faults), default=float("inf"))
    finders = [_finders(fault, alerts) for fault in faults]
    explained = {index for found in finders for index in found}
    consequences: set[int] = set()
    scores = []
    for fault, found in zip(faults, finders, strict=True):
        expect = EXPECTED[fault["fault"]]
        after = [
            (index, alert)
            for index, alert in enumerate(alerts)
            if alert.opened_at >= fault["start_ts"] - CLOCK_SLACK_S
        ]
        # Another alert of the same kind that no fault explains named the wrong culprit.
        wrong = any(a.kind in expect.kinds and i not in explained for i, a in after)
        consequences.update(
            i
            for i, a in after
            if a.kind in expect.consequences and names_subject(a, fault["subject"], "run")
        )
        first = alerts[found[0]] if found else None
        if fault["fault"] == "resume":
            booked = _resume_booked(fault, by_run)
            scores.append(FaultScore("resume", fault_label(fault), booked, booked, None))
            continue
        scores.append(
            FaultScore(
                fault=fault["fault"],
                label=fault_label(fault),
                found=first is not None,
                culprit_right=first is not None and not wrong,
                time_to_detect=None if first is None else first.opened_at - fault["start_ts"],
            )
        )
    consequences -= explained
    false_alarms = tuple(
        alert
        for index, alert in enumerate(alerts)
        if index not in explained
        and (index not in consequences or alert.opened_at < first_fault - CLOCK_SLACK_S)
    )
    return ScenarioScore(
        faults=tuple(scores),
        false_alarms=false_alarms,
        consequences=tuple(alerts[index] for index in sorted(consequences)),
    )


@dataclass(frozen=True)
class KindRow:
    label: str
    scenarios: int
    found: int
    culprit_right: int
    false_alarms: int
    consequences: int
    ttd_median: float | None
    ttd_max: float | None
    defined_wait: str


def summarize(scored: Sequence[ScenarioScore]) -> list[KindRow]:
    """One row per fault label (kind/mode) across seeds, plus "clean" for fault-free runs."""
    groups: dict[str, list[tuple[FaultScore | None, ScenarioScore]]] = {}
    for score in scored:
        if not score.faults:
            groups.setdefault("clean", []).append((None, score))
        for fault_score in score.faults:
            groups.setdefault(fault_score.label, []).append((fault_score, score))
    rows = []
    for label, items in groups.items():
        faults = [item for item, _ in items if item is not None]
        times = [f.time_to_detect for f in faults if f.time_to_detect is not None]
        kind = faults[0].fault if faults else ""
        rows.append(
            KindRow(
                label=label,
                scenarios=len(items),
                found=sum(f.found for f in faults),
                culprit_right=sum(f.culprit_right for f in faults),
                false_alarms=sum(len(score.false_alarms) for _, score in items),
                consequences=sum(len(score.consequences) for _, score in items),
                ttd_median=statistics.median(times) if times else None,
                ttd_max=max(times) if times else None,
                defined_wait=EXPECTED[kind].defined_wait if kind in EXPECTED else "",
            )
        )
    return sorted(rows, key=lambda row: (row.label == "clean", row.label))


def format_table(rows: Sequence[KindRow]) -> str:
    """A Markdown table: recall, culprit, false alarms, time to detect per fault label."""

    def seconds(value: float | None) -> str:
        return "—" if value is None else f"{max(0.0, value):.0f} s"  # never "-0 s"

    lines = [
        "| fault | runs | recall | culprit right | false alarms | consequences "
        "| TTD median | TTD max | detector's own wait |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        clean = row.label == "clean"
        recall = "—" if clean else f"{row.found}/{row.scenarios}"
        culprit = "—" if clean else f"{row.culprit_right}/{row.scenarios}"
        lines.append(
            f"| {row.label} | {row.scenarios} | {recall} | {culprit} | {row.false_alarms} "
            f"| {row.consequences} | {seconds(row.ttd_median)} | {seconds(row.ttd_max)} "
            f"| {row.defined_wait or '—'} |"
        )
    return "\n".join(lines)


def format_sensitivity(levels: Mapping[str, Sequence[KindRow]]) -> str:
    """A Markdown table of the same fault at several strengths (rows: each level's labels,
    e.g. "1.2x straggler") and noise levels (columns: `levels`' keys): found and time to
    detect."""

    def seconds(value: float | None) -> str:
        return "—" if value is None else f"{max(0.0, value):.0f} s"

    labels: list[str] = []
    for rows in levels.values():
        labels += [row.label for row in rows if row.label not in labels and row.label != "clean"]
    header = "| fault |" + "".join(f" {name}: found | TTD median | TTD max |" for name in levels)
    lines = [header, "|---|" + "---|---|---|" * len(levels)]
    for label in sorted(labels, key=_strength):
        cells = []
        for rows in levels.values():
            row = next((r for r in rows if r.label == label), None)
            if row is None:
                cells.append(" — | — | — |")
            else:
                found = f"{row.found}/{row.scenarios}"
                cells.append(f" {found} | {seconds(row.ttd_median)} | {seconds(row.ttd_max)} |")
        lines.append(f"| {label} |" + "".join(cells))
    return "\n".join(lines)


def _strength(label: str) -> tuple[float, str]:
    """ "1.5x straggler" sorts by 1.5; other labels after, by name."""
    head = label.split("x ", 1)[0]
    try:
        return float(head), label
    except ValueError:
        return float("inf"), label
