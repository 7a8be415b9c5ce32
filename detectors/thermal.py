"""Thermal and power: GPUs too hot, or held back by NVML clocks-event (throttle) reasons.

"Over the limit for 30 s" means at least `sustain_share` (80%) of the samples of the last
30 s are over it, with the series reaching back that far (`sustained.sustained`), not that
every sample is. Why it holds under noise: a single hot reading is one sample of the span
(with 10 s samples, 1 of 4) and never reaches the share, so a spike raises nothing; a GPU
that is really hot stays found through a stray cool reading once the span holds five or
more samples (with 10 s samples a 30 s span holds four, so there all four must be over:
the longer throttle and power spans of 300 s tolerate several). A finding needs the newest
samples to keep the share, so it resolves once the GPU has cooled for a fifth of the span.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.typing import NDArray

from detectors.common import (
    median,
    node_runs,
    node_subject,
    series_index,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.sustained import (
    at_least,
    mask_bits,
    over,
    sustained_tails,
    sustained_tails_each,
    sustained_where,
)
from detectors.types import ClusterWindow, Finding, FloatColumn, Series

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


_EMPTY = Series("", "", None, ())


def _mask_evidence(mask: int, clock: Series) -> dict[str, object]:
    """The throttle mask decoded, and the SM clock when sent: built for a finding only (a
    pass walks every GPU, and nearly all raise nothing)."""
    evidence: dict[str, object] = {
        "throttle_mask": mask,
        "throttle_reasons": throttle_reasons(mask),
    }
    if len(clock):
        evidence["sm_clock_mhz"] = clock.values[-1].item()
    return evidence


def _lasting(
    series: Series,
    met_of: Callable[[FloatColumn], NDArray[np.bool_]],
    needed: float,
    config: DetectorConfig,
) -> float | None:
    """When the condition `met_of` (per sample, of the values) began, if it has held for
    `needed` seconds (see the module docstring); else None."""
    return sustained_where(series.times, series.values, met_of, needed, config.sustain_share)


def _recent_median(series: Series, span: float) -> float:
    times = series.times
    return median(series.values[times >= times[-1] - span].tolist())


def _may_raise(window: ClusterWindow, config: DetectorConfig) -> list[tuple[str, int]]:
    """The GPUs, in order, whose series pass the first test of a `_lasting` that a finding
    needs (`sustained.sustained_tails`): hot, or thermally throttled, or power-capped (a power
    finding needs both its cap and its throttle to last). Every other GPU raises nothing,
    and nearly all GPUs are those."""
    temps = [s for s in window.telemetry if s.gpu is not None and s.metric == "gpu.temp_c"]
    masks = [
        s for s in window.telemetry if s.gpu is not None and s.metric == "gpu.throttle_reasons"
    ]
    share = config.sustain_share
    hot = sustained_tails(
        temps, partial(over, limit=config.thermal_temp_c), config.thermal_temp_s, share
    )
    throttled, capped = sustained_tails_each(
        masks,
        [
            (partial(mask_bits, bits=THERMAL_BITS), config.throttle_s),
            (partial(mask_bits, bits=POWER_BITS), config.power_s),
        ],
        share,
    )
    gpus = {(s.node, s.gpu) for s, yes in zip(temps, hot, strict=True) if yes}
    gpus |= {(s.node, s.gpu) for s, *yes in zip(masks, throttled, capped, strict=True) if any(yes)}
    return sorted(gpus)  # type: ignore[arg-type]


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Per GPU (`node:<n>/gpu:<g>`): `thermal` when over `thermal_temp_c` for
    `thermal_temp_s` or thermally throttled for `throttle_s` (critical from
    `thermal_critical_c`); `power` when at `power_share` of its limit with power-cap
    throttling for `power_s`. Evidence decodes the throttle mask. Reads each series'
    columns with numpy: every GPU's series is walked every pass."""
    index = series_index(window)
    runs_of = node_runs(window)
    findings = []
    for node, gpu in _may_raise(window, config):

        def series(metric: str, node: str = node, gpu: int | None = gpu) -> Series:
            return index.get((node, gpu, metric), _EMPTY)

        temps, masks = series("gpu.temp_c"), series("gpu.throttle_reasons")
        mask = int(masks.values[-1].item()) if len(masks) else 0
        hot = _lasting(temps, partial(over, limit=config.thermal_temp_c),
                       config.thermal_temp_s, config)  # fmt: skip
        throttled = _lasting(
            masks, partial(mask_bits, bits=THERMAL_BITS), config.throttle_s, config
        )
        if hot is not None or throttled is not None:
            # The span's median: one stray reading neither hides nor escalates it.
            temp = _recent_median(temps, config.thermal_temp_s) if len(temps) else None
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
                    evidence={
                        "temp_c": temp,
                        "limit_c": config.thermal_temp_c,
                        **_mask_evidence(mask, series("gpu.sm_clock_mhz")),
                    },
                    since=since,
                )
            )
        power, limits = series("gpu.power_w"), series("gpu.power_limit_w")
        if not len(power) or not len(limits):
            continue
        limit, drawn = limits.values[-1].item(), power.values[-1].item()
        if limit <= 0:
            continue
        at_cap_of = partial(at_least, limit=config.power_share * limit)
        at_cap = _lasting(power, at_cap_of, config.power_s, config)
        capped = _lasting(masks, partial(mask_bits, bits=POWER_BITS), config.power_s, config)
        if at_cap is None or capped is None:
            continue
        reasons = [r for b, r in REASONS.items() if b & POWER_BITS & mask]
        findings.append(
            Finding(
                kind="power",
                subject=node_subject(node, gpu),
                severity="warning",
                summary=(
                    f"GPU {gpu} of {node} draws {drawn:.0f} W of its "
                    f"{limit:.0f} W limit, throttled by {', '.join(reasons) or 'power cap'}"
                ),
                run=runs_of.get(node),
                node=node,
                gpu=gpu,
                evidence={
                    "power_w": drawn,
                    "power_limit_w": limit,
                    **_mask_evidence(mask, series("gpu.sm_clock_mhz")),
                },
                since=max(at_cap, capped),
            )
        )
    return findings
