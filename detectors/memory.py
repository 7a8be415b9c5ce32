"""GPU memory: `oom_risk` before an out-of-memory error, `oom` once one happened.

Why `oom_risk` holds under noise: the level it compares with `oom_mem_share` is the median
of the newest three samples, so one spiking reading is no risk and one low reading hides
none. The trend is a Theil–Sen fit (the median of the pairwise slopes) over the medians of
up to 12 equal slices of the last `oom_trend_window_s` seconds: a single outlier moves at
most one slice median, and the slope median ignores up to ~29% of wild slices, where a
least-squares line swings with one far point. The trend counts only while the newest level
is still on the fitted line (after a crash frees memory, the earlier climb predicts
nothing).

A robust slope is still a slope of noise when there is little to fit: five samples a second
apart of a flat series jittering by 0.2 % read as tens of MiB/s, and extrapolated to an
ETA of minutes that was an `oom_risk` on a healthy job's first seconds (issue 29: nine of
them on every `make demo` start). So a growth finding also needs evidence that there is
growth: at least `oom_trend_min_points` samples spanning `oom_trend_min_span_s` seconds
(the ETA extrapolates the span ~10x, not ~100x), and a rise predicted over that span of more
than `oom_trend_noise_k` times the series' own noise. The noise is the robust σ of one
sample from the MAD of successive differences: a trend, or a climb that began mid-window,
adds a constant to the differences, which the MAD removes, where residuals about the
fitted line would count the misfit of a late climb as noise and hold a real leak back. A
real climb passes both at once (50 MiB/s rises 3 GiB in a minute, against ~75 MiB of
jitter); a flat series would need a ~4σ drift in the fitted slope, and then still an ETA
within `oom_horizon_s`. Hysteresis is the alert's: an open `oom_risk` resolves only once
no finding has come for `ALERT_HOLD_DOWN_S`, and a real climb's rise only grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detectors.common import (
    median,
    node_runs,
    node_subject,
    run_subject,
    series_index,
    unique_events,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, Series

USED, TOTAL = "gpu.mem_used_bytes", "gpu.mem_total_bytes"
GIB = 2**30
SLICES = 12


# σ of a normal sample from the MAD, and from a difference of two samples: σ√2.
MAD_TO_SIGMA = 1.4826
DIFF_TO_SAMPLE = 1 / math.sqrt(2)


@dataclass(frozen=True)
class Trend:
    """A fitted trend of `points`: `rate` per second, the line's value at the newest time,
    the series' own noise (robust σ of one sample) and the seconds the points span."""

    rate: float
    fitted: float
    noise: float
    span: float

    def significant(self, k: float) -> bool:
        """The rise the rate predicts over the span is more than `k` σ of noise."""
        return self.rate > 0 and self.rate * self.span > k * self.noise


def slope(points: list[tuple[float, float]]) -> float:
    """Robust slope of value over time (units per second): Theil–Sen over slice medians
    (see the module docstring); 0 for < 2 distinct times."""
    return trend(points).rate


def trend(points: list[tuple[float, float]]) -> Trend:
    """The Theil–Sen `Trend` of `points`, oldest first (see the module docstring)."""
    if not points:
        return Trend(0.0, 0.0, 0.0, 0.0)
    n = len(points)
    k = min(n, SLICES)
    slices = [points[i * n // k : (i + 1) * n // k] for i in range(k)]
    centres = [(median([t for t, _ in p]), median([v for _, v in p])) for p in slices if p]
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(centres)
        for t2, v2 in centres[i + 1 :]
        if t2 != t1
    ]
    rate = median(slopes) if slopes else 0.0
    last = points[-1][0]
    fitted = median([v + rate * (last - t) for t, v in centres])
    return Trend(rate, fitted, noise(points), last - points[0][0])


def noise(points: list[tuple[float, float]]) -> float:
    """Robust σ of one sample about its neighbours: the MAD of successive differences
    (a trend shifts them all alike, so it is no noise); 0 for < 3 points."""
    if len(points) < 3:
        return 0.0
    diffs = [b[1] - a[1] for a, b in zip(points, points[1:], strict=False)]
    centre = median(diffs)
    return MAD_TO_SIGMA * DIFF_TO_SAMPLE * median([abs(d - centre) for d in diffs])


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`oom_risk` warnings per GPU (`node:<n>/gpu:<g>`), and one critical `oom` per rank
    that reported an out-of-memory error (`run:<run>/rank:<r>`)."""
    return _risk(window, config) + _ooms(window)


def _risk(window: ClusterWindow, config: DetectorConfig) -> list[Finding]:
    index = series_index(window)
    runs_of = node_runs(window)
    findings = []
    # The order is that of the keys' text; only the used-memory series need it (a tenth).
    used_series = [(key, series) for key, series in index.items() if key[2] == USED]
    totals = {
        key: total.values[-1].item()
        for key, _ in used_series
        if (total := index.get((key[0], key[1], TOTAL))) is not None and len(total)
    }
    screened = [
        (key, series) for key, series in used_series if len(series) and totals.get(key, 0.0) > 0
    ]
    may_risk = _may_risk([series for _, series in screened],
                         [totals[key] for key, _ in screened], config)  # fmt: skip
    risky = [pair for pair, may in zip(screened, may_risk, strict=True) if may]
    for (node, gpu, _), series in sorted(risky, key=lambda kv: str(kv[0])):
        # Read as columns: a 1,024-GPU window holds ~10^5 points of used memory, and only
        # the few series that pass the cheap screen below are fitted point by point.
        times, values = series.times, series.values
        total = totals[node, gpu, USED]
        last_ts = times[-1].item()
        used = median(values[-3:].tolist())
        share = used / total
        cutoff = last_ts - config.oom_trend_window_s
        # times are oldest first (Series): the window's tail starts where cutoff would go
        start = int(np.searchsorted(times, cutoff, side="left"))  # the newest is in it
        rate, fitted = 0.0, used
        span = last_ts - times[start].item()
        # Enough samples over enough time, or the slope is the jitter of a few readings.
        if (
            len(times) - start >= config.oom_trend_min_points
            and span >= config.oom_trend_min_span_s
        ):
            # The rate between the medians of both ends screens out flat series cheaply.
            first = median(values[start : start + 3].tolist())
            rough = (used - first) / span
            if rough > 0 and (total - used) / rough <= 3 * config.oom_horizon_s:
                points = zip(times[start:].tolist(), values[start:].tolist(), strict=True)
                fit = trend(list(points))
                if fit.significant(config.oom_trend_noise_k):
                    rate, fitted = fit.rate, fit.fitted
        # A trend only counts while memory is still on it: after a crash frees it, the
        # earlier climb no longer predicts anything.
        rising = rate > 0 and used >= fitted - 0.03 * total
        eta = max(0.0, total - fitted) / rate if rising else None
        if share < config.oom_mem_share and (eta is None or eta > config.oom_horizon_s):
            continue
        summary = f"GPU {gpu} of {node} uses {share:.0%} of its memory"
        if share >= config.oom_mem_share:
            over = np.flatnonzero(values / total >= config.oom_mem_share)
            since = times[over[0]].item() if len(over) else last_ts
        else:
            since = times[start].item()
        if eta is not None:
            summary += f", growing {rate / 2**20:.0f} MiB/s: full in about {eta / 60:.0f} min"
        findings.append(
            Finding(
                kind="oom_risk",
                subject=node_subject(node, gpu),
                severity="warning",
                summary=summary,
                run=runs_of.get(node),
                node=node,
                gpu=gpu,
                evidence={
                    "used_bytes": used,
                    "total_bytes": total,
                    "share": round(share, 4),
                    "growth_bytes_per_s": round(rate, 1),
                    "seconds_to_full": round(eta, 1) if eta is not None else None,
                    "limit_share": config.oom_mem_share,
                },
                since=since,
            )
        )
    return findings


def _may_risk(used: list[Series], totals: list[float], config: DetectorConfig) -> list[bool]:
    """For each GPU's used memory (not empty) and total (> 0), whether `_risk` may find a
    risk: its level is near the share, or its tail passes the screen of the trend (enough
    samples over enough time, rising fast enough between both ends). Where this says
    False, `_risk` finds nothing. In numpy for every GPU at once (the levels, the ends'
    medians of three as the middle of three), with a hair of slack so that rounding can
    only widen it: at 16,384 GPUs the Python screen of each was most of memory's pass."""
    count = len(used)
    may = [True] * count  # a series too short for the vectorised screen is looked at
    if config.oom_trend_min_points < 3 or not count:
        return may
    slack = 1e-9
    lasts = np.array([s.times[-1] for s in used])
    starts = [
        int(s.times.searchsorted(last - config.oom_trend_window_s, side="left"))
        for s, last in zip(used, lasts.tolist(), strict=True)
    ]
    long = [i for i, s in enumerate(used) if len(s) >= 3]
    if not long:
        return may
    level = np.median(np.array([used[i].values[-3:] for i in long]), axis=1)
    total = np.array([totals[i] for i in long])
    tail = np.array([len(used[i]) - starts[i] for i in long])
    trended = tail >= config.oom_trend_min_points
    # the first three of a tail too short to be fitted: any three, it is not read
    first = np.median(
        np.array([used[i].values[starts[i] : starts[i] + 3] if trended[j] else used[i].values[:3]
                  for j, i in enumerate(long)]),
        axis=1,
    )  # fmt: skip
    span = lasts[long] - np.array([used[i].times[starts[i]] for i in long])
    with np.errstate(divide="ignore", invalid="ignore"):
        rough = (level - first) / span
        eta = (total - level) / rough
    fitted = (
        trended
        & (span >= config.oom_trend_min_span_s * (1 - slack))
        & ~(rough <= 0)
        & ~(eta > 3 * config.oom_horizon_s * (1 + slack))
    )
    near = level / total >= config.oom_mem_share * (1 - slack)
    for i, yes in zip(long, (near | fitted).tolist(), strict=True):
        may[i] = yes
    return may


def _ooms(window: ClusterWindow) -> list[Finding]:
    latest: dict[str, Finding] = {}
    for run, event in unique_events(window, "oom"):
        rank = event.rank if event.rank is not None else event.data.get("rank")
        subject = (
            run_subject(run, rank=rank)
            if run is not None and rank is not None
            else node_subject(event.node, event.gpu)
        )
        who = f"rank {rank} on {event.node}" if rank is not None else event.node
        message = str(event.data.get("message", ""))[:300]
        latest[subject] = Finding(
            kind="oom",
            subject=subject,
            severity="critical",
            summary=f"{who} ran out of GPU memory" + (f" ({run})" if run else ""),
            run=run,
            node=event.node,
            rank=rank,
            gpu=event.gpu,
            evidence={"at": event.ts, "step": event.step, "message": message},
            since=event.ts,
        )
    return list(latest.values())
