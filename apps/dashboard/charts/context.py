"""RunContext: what several of the run page's charts share, read once. Below both run.py
and ranks.py, which take it (so the charts import one way: run → ranks → context)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from apps.dashboard.selectors.ranges import TimeRange
from apps.dashboard.selectors.runs import run_span
from apps.runs.models import Run


@dataclass(frozen=True)
class RunContext:
    run: Run
    began: float  # selectors.runs.run_began(run): when its first step was reported
    now: float = field(default_factory=time.time)  # summary's moment, when one is given
    summary: dict[str, Any] | None = None  # run_summary, for the goodput chart
    # the step history of a span, read once for the throughput, stages and loss charts
    step_histories: dict[tuple[float, float], dict[str, Any]] = field(default_factory=dict)
    # checksum agreement per range, read once for the chart and the page's table
    checks: dict[tuple[float, float], list[dict[str, Any]]] = field(default_factory=dict)
    # the heat-map drilled into one group of a frontier run: its first and last node by name
    rank_group: tuple[str, str] | None = None

    def span(self, tr: TimeRange) -> tuple[float, float]:
        return run_span(run=self.run, tr=tr, began=self.began)
