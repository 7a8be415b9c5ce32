"""Thermal and power: GPUs too hot, or held back by NVML clocks-event (throttle) reasons.

"Over the limit for 30 s" means at least `sustain_share` (80%) of the samples of the last
30 s are over it, with the series reaching back that far (`common.sustained`), not that
every sample is. Why it holds under noise: a single hot reading is one sample of the span
(with 10 s samples, 1 of 4) and never reaches the share, so a spike raises nothing; a GPU
that is really hot stays found through a stray cool reading once the span holds five or
more samples (with 10 s samples a 30 s span holds four, so there all four must be over:
the longer throttle and power spans of 300 s tolerate several). A finding needs the newest
samples to keep the share, so it resolves once the GPU has cooled for a fifth of the span.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from detectors.common import median, node_runs, node_subject, series_index, sustained
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding

# NVML clocksEventReasons (nvmlClocksThrottleReasons) bits, in bit order.
REASONS = {
    0x1: "GPU_IDLE",
    0x2: "APPLICATIONS_CLOCKS_SETTING",
    0x4: "SW_POWER_CAP",
    0x8: "HW_SLOWDOWN",
    0x10: "SYNC_BOOST",
    0x20: "SW_THERMAL_SLOWDOWN",
    0x40: "HW_THERMAL_SLOWDOWN",
    0x80: "HW_POWER_BRAKE_SLOWDOWN",
    0x100: "DISPLAY_CLOCK_SETTING",
}
THERMAL_BITS = 0x20 | 0x40 | 0x08
POWER_BITS = 0x04 | 0x80


def throttle_reasons(mask: int | float) -> list[str]:
    """The names of the bits set in an NVML throttle-reasons mask, lowest bit first; bits
    NVML does not define come out as `UNKNOWN_0x…`."""
    value = int(mask)
    names = []
    bit = 1
    while bit <= value:
        if value & bit:
            names.append(REASONS.get(bit, f"UNKNOWN_{bit:#x}"))
        bit <<= 1
    return names


def _lasting(
    points: Sequence[tuple[float, float]],
    condition: Callable[[float], object],
    needed: float,
    config: DetectorConfig,
) -> float | None:
    """When the condition began, if it has held for `needed` seconds (see the module
    docstring); else None."""
    return sustained(points, condition, needed, config.sustain_share)


def _recent_median(points: Sequence[tuple[float, float]], span: float) -> float:
    end = points[-1][0]
    return median([v for t, v in points if t >= end - span])


def _at_least(limit: float) -> Callable[[float], bool]:
    return lambda value: value >= limit


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Per GPU (`node:<n>/gpu:<g>`): `thermal` when over `thermal_temp_c` for
    `thermal_temp_s` or thermally throttled for `throttle_s` (critical from
    `thermal_critical_c`); `power` when at `power_share` of its limit with power-cap
    throttling for `power_s`. Evidence decodes the throttle mask."""
    index = series_index(window)
    runs_of = node_runs(window)
    gpus = sorted({(s.node, s.gpu) for s in window.telemetry if s.gpu is not None})
    findings = []
    for node, gpu in gpus:

        def points(metric: str, node: str = node, gpu: int | None = gpu):
            series = index.get((node, gpu, metric))
            return series.points if series is not None else ()

        temps, masks = points("gpu.temp_c"), points("gpu.throttle_reasons")
        mask = int(masks[-1][1]) if masks else 0
        decoded = throttle_reasons(mask)
        common = {"throttle_mask": mask, "throttle_reasons": decoded}
        clock = points("gpu.sm_clock_mhz")
        if clock:
            common["sm_clock_mhz"] = clock[-1][1]
        hot = _lasting(temps, lambda v: v > config.thermal_temp_c, config.thermal_temp_s, config)
        throttled = _lasting(masks, lambda v: int(v) & THERMAL_BITS, config.throttle_s, config)
        if hot is not None or throttled is not None:
            # The span's median: one stray reading neither hides nor escalates it.
            temp = _recent_median(temps, config.thermal_temp_s) if temps else None
            reasons = [r for b, r in REASONS.items() if b & THERMAL_BITS & mask]
            text = f"GPU {gpu} of {node} "
            text += (
                f"runs at {temp:.0f} °C (limit {config.thermal_temp_c:.0f} °C)"
                if temp
                else "is hot"
            )
            if reasons:
                text += f", throttled by {', '.join(reasons)}"
            since = min(s for s in (hot, throttled) if s is not None)
            critical = temp is not None and temp >= config.thermal_critical_c
            findings.append(
                Finding(
                    kind="thermal",
                    subject=node_subject(node, gpu),
                    severity="critical" if critical else "warning",
                    summary=text,
                    run=runs_of.get(node),
                    node=node,
                    gpu=gpu,
                    evidence={"temp_c": temp, "limit_c": config.thermal_temp_c, **common},
                    since=since,
                )
            )
        power, limits = points("gpu.power_w"), points("gpu.power_limit_w")
        if not power or not limits or limits[-1][1] <= 0:
            continue
        at_cap = _lasting(
            power, _at_least(config.power_share * limits[-1][1]), config.power_s, config
        )
        capped = _lasting(masks, lambda v: int(v) & POWER_BITS, config.power_s, config)
        if at_cap is None or capped is None:
            continue
        reasons = [r for b, r in REASONS.items() if b & POWER_BITS & mask]
        findings.append(
            Finding(
                kind="power",
                subject=node_subject(node, gpu),
                severity="warning",
                summary=(
                    f"GPU {gpu} of {node} draws {power[-1][1]:.0f} W of its "
                    f"{limits[-1][1]:.0f} W limit, throttled by {', '.join(reasons) or 'power cap'}"
                ),
                run=runs_of.get(node),
                node=node,
                gpu=gpu,
                evidence={"power_w": power[-1][1], "power_limit_w": limits[-1][1], **common},
                since=max(at_cap, capped),
            )
        )
    return findings
