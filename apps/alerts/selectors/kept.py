"""The detectors' window kept by a periodic worker between its passes over a cluster.

A 16,384-rank run's window is 2 M step reports; reloading it every pass cost 8 s of the
worker's CPU where a pass has 5 s. Kept, a pass reads only the steps that changed since this
worker's last pass over the cluster (apps.runs.changes says which, exactly), drops the steps
that fell out of the window, and hands the detectors the unchanged steps as the same lists,
so that their per-step results carry over too (detectors.common.StepResults).

The window a pass sees is the one a whole load would give (`steps_load`): each changed step
is reloaded whole, in the same order. A run seen for the first time, restarted (a new
timeline), whose window moved back, or whose kept copy is older than KEPT_MAX_AGE_S (it may
have passed to another worker meanwhile, and the change log is pruned) is loaded whole, as
is a run over its reports cap (steps_load's rule for it). Each worker keeps its own copy:
passes of one cluster may run on any periodic worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from operator import attrgetter

from django.conf import settings

from apps.alerts.selectors.kept_telemetry import KeptSeries
from apps.alerts.selectors.steps import reports_cap, steps_in_ranges, steps_load
from apps.runs.changes import step_changes_since, step_changes_snapshot
from apps.runs.models import Run
from detectors.common import StepResults
from detectors.types import StepRow

# Past this a kept window is reloaded whole: well inside apps.runs.changes' retention.
KEPT_MAX_AGE_S = 60.0

StepGroups = dict[int, list[StepRow]]  # step number → its reports, ascending steps
_STEP = attrgetter("step")


@dataclass
class _KeptRun:
    after: datetime | None  # the run's timeline_after when loaded
    low: int  # steps above this are in the window
    groups: StepGroups


@dataclass
class KeptWindow:
    """One cluster's window as this worker's last pass left it: its runs' steps, here, and
    its telemetry (apps.alerts.selectors.kept_telemetry)."""

    watermark: int | None = None  # apps.runs.changes: the last pass's snapshot xmin
    used_at: float = 0.0  # time.monotonic() of the last pass
    runs: dict[int, _KeptRun] = field(default_factory=dict)
    results: StepResults = field(default_factory=StepResults)  # the detectors' per-step ones
    telemetry: KeptSeries = field(default_factory=KeptSeries)

    def rows(self) -> int:
        """Step rows and telemetry points held."""
        steps = sum(len(rows) for run in self.runs.values() for rows in run.groups.values())
        return steps + self.telemetry.size


_KEPT: dict[int, KeptWindow] = {}


def kept_window(*, cluster_id: int) -> KeptWindow:
    """This worker's kept window of the cluster (a fresh one the first time). Windows of
    clusters this worker has not evaluated for KEPT_MAX_AGE_S are dropped, and the least
    recently evaluated others while all hold more than ALERT_KEPT_MAX_ROWS rows: a worker
    holds that much beside the window of the pass it runs."""
    now = time.monotonic()
    for stale in [c for c, k in _KEPT.items() if now - k.used_at > KEPT_MAX_AGE_S]:
        del _KEPT[stale]
    held = {c: k.rows() for c, k in _KEPT.items() if c != cluster_id}
    for oldest in sorted(held, key=lambda c: _KEPT[c].used_at):
        if sum(held.values()) <= settings.ALERT_KEPT_MAX_ROWS:
            break
        del _KEPT[oldest], held[oldest]
    return _KEPT.setdefault(cluster_id, KeptWindow())


def steps_kept(
    runs: list[Run], *, names: dict[int, str], kept: KeptWindow
) -> dict[int, StepGroups]:
    """run id → its window's steps (see the module docstring), updating `kept`."""
    snapshot = step_changes_snapshot()  # before anything it vouches for is read
    fresh = snapshot.covers(kept.watermark) and time.monotonic() - kept.used_at <= KEPT_MAX_AGE_S
    changes = step_changes_since(run_ids=[r.id for r in runs], xid=kept.watermark) if fresh else {}
    whole: list[Run] = []
    wanted: dict[int, list[tuple[int, int]]] = {}
    for run in runs:
        held, low = kept.runs.get(run.id), (run.last_step or 0) - settings.ALERT_STEP_WINDOW
        if not fresh or held is None or held.after != run.timeline_after or low < held.low:
            whole.append(run)
            continue
        for number in [n for n in held.groups if n <= low]:
            del held.groups[number]
        held.low = low
        spans = [(max(a, low + 1), b) for a, b in changes.get(run.id, ()) if b > low]
        if spans:
            wanted[run.id] = spans
    by_id = {run.id: run for run in runs}
    reloaded = steps_in_ranges(wanted, runs=by_id, names=names)
    for run_id, spans in wanted.items():
        held = kept.runs[run_id]
        _replace_steps(held, spans, _grouped(reloaded.get(run_id, [])))
        if sum(map(len, held.groups.values())) > reports_cap(by_id[run_id]):
            whole.append(by_id[run_id])  # steps_load keeps the highest steps' newest only
    loaded = steps_load(whole, names=names, until=None) if whole else {}
    for run in whole:
        low = (run.last_step or 0) - settings.ALERT_STEP_WINDOW
        kept.runs[run.id] = _KeptRun(run.timeline_after, low, _grouped(loaded.get(run.id, [])))
    kept.runs = {run.id: kept.runs[run.id] for run in runs}
    kept.watermark, kept.used_at = snapshot.xmin, time.monotonic()
    return {run.id: kept.runs[run.id].groups for run in runs}


def _grouped(rows: list[StepRow]) -> StepGroups:
    """Rows ordered by step → step → a new list of its rows."""
    return {number: list(group) for number, group in groupby(rows, _STEP)}


def _replace_steps(held: _KeptRun, spans: list[tuple[int, int]], fresh: StepGroups) -> None:
    """The steps in `spans` become what was just read (a step no longer read goes); every
    other step keeps its list. Kept lists are never changed in place: a result the
    detectors kept for a list must stay that list's."""
    for number in [n for n in held.groups if any(a <= n <= b for a, b in spans)]:
        del held.groups[number]
    held.groups.update(fresh)
    numbers = list(held.groups)
    if any(a > b for a, b in zip(numbers, numbers[1:], strict=False)):
        held.groups = dict(sorted(held.groups.items()))
