"""Opsboard's detectors: pure functions from a window of recent data to findings.

`detect_all(window, now, config)` runs every detector. Each module has
`detect(window, now, config) -> list[Finding]`; run-level ones also `detect_run(run, now,
config)`. Nothing here imports Django or touches storage: a service loads the window (see
`detectors.types`), calls these, and stores the findings.
"""

from __future__ import annotations

from collections.abc import Callable

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
    window: ClusterWindow, now: float, config: DetectorConfig | None = None
) -> list[Finding]:
    """Every detector's findings for `window` at `now`, ordered by (kind, subject); at most
    one finding per (kind, subject)."""
    config = config or DEFAULT_CONFIG
    found: dict[tuple[str, str], Finding] = {}
    for detector in DETECTORS:
        for finding in detector(window, now, config):
            found.setdefault((finding.kind, finding.subject), finding)
    return [found[key] for key in sorted(found)]


__all__ = [
    "DETECTORS",
    "DetectorConfig",
    "Finding",
    "Goodput",
    "detect_all",
    "goodput",
    "throttle_reasons",
]
