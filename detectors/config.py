"""Every detector threshold in one frozen dataclass, with per-cluster overrides.

The defaults are the house rules (issue 4); a cluster may override any of them, e.g. from a
JSON settings field: `DetectorConfig().with_overrides({"straggler_slowdown": 0.2})`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of all detectors. Times are seconds, shares are fractions (0.15 = 15 %)."""

    # straggler: over the last `straggler_steps` steps, a rank's median ratio to its peers'
    # median is at least 1 + `straggler_slowdown` and at least `straggler_share` of those
    # steps are that slow (a clear majority: one noisy step neither hides nor makes one)
    straggler_slowdown: float = 0.15
    straggler_steps: int = 20
    straggler_share: float = 0.75
    # straggler under noise: the step-to-step spread (robust σ of log(compute / peers'
    # median)) that `straggler_steps` is sized for, about CV 10 %. A noisier run gets a
    # longer window, N × (σ / σ_ref)², up to half the steps the window holds, so the
    # binomial tail of a healthy rank reaching the share stays as small as at CV 10 %.
    straggler_noise_ref: float = 0.12
    # ... and a young run's window (fewer steps than the service's ALERT_STEP_WINDOW = 120)
    # may use up to this many steps, all it holds, rather than half: at N = 20 its first
    # windows would be as noisy as before
    straggler_steps_max: int = 60
    # sdc: canary fingerprints agree within this relative tolerance
    sdc_canary_rtol: float = 1e-4
    sdc_critical_checks: int = 2
    # input_bound: (data + h2d) share of the step, median over the last N steps
    input_share: float = 0.20
    input_steps: int = 20
    input_cpu_util: float = 90.0  # host CPU % above which the loader is CPU-starved ...
    input_gpu_util: float = 50.0  # ... while the GPUs are this idle
    input_sustain_s: float = 60.0
    # hang: no new step for max(factor × median step time, min) while nodes still report
    hang_factor: float = 10.0
    hang_min_s: float = 120.0
    checkpoint_timeout_s: float = 1800.0  # a checkpoint this old no longer excuses a stall
    # checkpoint_stale / checkpoint_upload
    checkpoint_stale_s: float = 3600.0
    checkpoint_upload_s: float = 600.0
    # oom_risk: memory share, or a linear trend reaching the total within the horizon
    oom_mem_share: float = 0.95
    oom_horizon_s: float = 600.0
    oom_trend_window_s: float = 300.0
    oom_trend_min_points: int = 5
    # ... and a trend is one only over at least this many seconds of samples (the ETA then
    # extrapolates the span ~10x, not ~100x as from 5 samples a second apart) ...
    oom_trend_min_span_s: float = 60.0
    # ... with a rise over that span of more than this many σ of the series' own noise
    # (robust σ of one sample, from the MAD of successive differences; issue 29)
    oom_trend_noise_k: float = 4.0
    # thermal / power / host-starved input: a condition "for T seconds" holds when at least
    # this share of the samples of the last T seconds meet it (not every single sample)
    sustain_share: float = 0.8
    # thermal / power
    thermal_temp_c: float = 85.0
    thermal_critical_c: float = 90.0
    thermal_temp_s: float = 30.0
    throttle_s: float = 300.0
    power_share: float = 0.98
    power_s: float = 300.0
    # ecc: counters of uncorrectable errors whose rise is critical
    ecc_metrics: tuple[str, ...] = (
        "gpu.ecc_uncorrectable",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    )
    # heartbeat: silent for more than max(factor × usual batch interval, min)
    heartbeat_factor: float = 3.0
    heartbeat_min_s: float = 30.0
    # fabric: the collective's own time up this much over the baseline, compute unchanged
    fabric_rise: float = 0.5
    fabric_compute_tolerance: float = 0.05
    fabric_steps: int = 20

    def with_overrides(self, overrides: Mapping[str, Any]) -> DetectorConfig:
        """A copy with `overrides` applied; unknown names or wrong types raise ValueError
        (a typo in a cluster's settings must not silently keep the default)."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in known:
                raise ValueError(f"unknown detector setting {name!r}")
            default = getattr(self, name)
            if isinstance(default, tuple):
                if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name} must be a list of metric names")
                value = tuple(value)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number")
            elif isinstance(default, int):
                if value != int(value) or value < 1:
                    raise ValueError(f"{name} must be a positive whole number")
                value = int(value)
            else:
                value = float(value)
                if value < 0:
                    raise ValueError(f"{name} must be >= 0")
            changes[name] = value
        return replace(self, **changes)


DEFAULT_CONFIG = DetectorConfig()


def config_for(
    cluster: str, overrides: Mapping[str, Mapping[str, Any]], base: DetectorConfig = DEFAULT_CONFIG
) -> DetectorConfig:
    """`base` with the overrides stored for `cluster` (none: `base` itself)."""
    return base.with_overrides(overrides[cluster]) if cluster in overrides else base
