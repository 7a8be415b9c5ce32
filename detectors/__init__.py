"""Opsboard's detectors: pure functions from a window of recent data to findings.

`detect_all(window, now, config)` runs every detector. Each module has
`detect(window, now, config) -> list[Finding]`; run-level ones also `detect_run(run, now,
config)`. Nothing here imports Django or touches storage: a service loads the window (see
`detectors.types`), calls these, and stores the findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from detectors import (
    checkpoint,
    fabric,
    hang,
    heartbeat,
    input_bound,
    memory,
    sdc,
    straggler,
    thermal,
    xid,
)
from detectors.common import StepResults, shared_results, use_step_groups
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.goodput import Goodput, goodput
from detectors.thermal import throttle_reasons
from detectors.types import ClusterWindow, Finding

Detector = Callable[[ClusterWindow, float, DetectorConfig], list[Finding]]

DETECTORS: tuple[Detector, ...] = (
    straggler.detect,
    sdc.detect,
    input_bound.detect,
    hang.detect,
    checkpoint.detect,
    memory.detect,
    thermal.detect,
    xid.detect,
    heartbeat.detect,
    fabric.detect,
)


def detect_all(
    window: ClusterWindow,
    now: float,
    config: DetectorConfig | None = None,
    kept: StepResults | None = None,
) -> list[Finding]:
    """Every detector's findings for `window` at `now`, ordered by (kind, subject); at most
    one finding per (kind, subject). `kept` carries per-step results over from the previous
    pass over the same cluster (see common.StepResults): the findings are the same."""
    config = config or DEFAULT_CONFIG
    found: dict[tuple[str, str], Finding] = {}
    # the detectors share groupings of this window, for this pass only
    with shared_results(kept):
        use_step_groups(window)
        for detector in DETECTORS:
            for finding in detector(window, now, config):
                found.setdefault((finding.kind, finding.subject), finding)
    return with_rank_gpus(relate([found[key] for key in sorted(found)]), window)


def with_rank_gpus(findings: list[Finding], window: ClusterWindow) -> list[Finding]:
    """A finding about a rank names the GPU that rank reported from (its newest step row in
    the window with a `gpu`, on the finding's node): the pages colour that GPU's tile alone.
    Findings that name a GPU already, or whose rank never named one, stay as they are."""
    wanted = {(f.run, f.rank) for f in findings if f.rank is not None and f.gpu is None}
    if not wanted:
        return findings
    placed: dict[tuple[str | None, int], tuple[str, int]] = {}
    for run in window.runs:
        if not any(key[0] == run.run for key in wanted):
            continue
        for row in reversed(run.steps):  # newest first, until every wanted rank is placed
            if row.gpu is not None and (run.run, row.rank) in wanted:
                placed.setdefault((run.run, row.rank), (row.node, row.gpu))
                if len(placed) == len(wanted):
                    break
    out = []
    for finding in findings:
        if finding.gpu is None and finding.rank is not None:
            node, gpu = placed.get((finding.run, finding.rank), (None, None))
            if node is not None and node == finding.node:
                finding = replace(finding, gpu=gpu)
        out.append(finding)
    return out


# A slow rank on a node whose GPU is hot or power-capped is most likely slow because of it.
EXPLAINS_STRAGGLER = ("thermal", "power")


def relate(findings: list[Finding]) -> list[Finding]:
    """Name the probable cause on findings that follow from another one: a straggler on a
    node with a thermal or power finding says so (both alerts stay: each has its own fix)."""
    causes: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.kind in EXPLAINS_STRAGGLER and finding.node:
            causes.setdefault(finding.node, []).append(finding)
    related = []
    for finding in findings:
        hot = causes.get(finding.node or "", []) if finding.kind == "straggler" else []
        if hot:
            gpus = ", ".join(f"GPU {f.gpu} {f.kind}" for f in hot if f.gpu is not None)
            finding = replace(
                finding,
                summary=f"{finding.summary}; probably because {finding.node} is throttling"
                + (f" ({gpus})" if gpus else ""),
                evidence={**finding.evidence, "probable_cause": [f.subject for f in hot]},
            )
        related.append(finding)
    return related


__all__ = [
    "DETECTORS",
    "DetectorConfig",
    "Finding",
    "Goodput",
    "StepResults",
    "detect_all",
    "goodput",
    "throttle_reasons",
]
