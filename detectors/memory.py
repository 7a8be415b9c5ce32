"""GPU memory: `oom_risk` before an out-of-memory error, `oom` once one happened.

Why `oom_risk` holds under noise: the level it compares with `oom_mem_share` is the median
of the newest three samples, so one spiking reading is no risk and one low reading hides
none. The trend is a Theil–Sen fit (the median of the pairwise slopes) over the medians of
up to 12 equal slices of the last `oom_trend_window_s` seconds, needing
`oom_trend_min_points` samples: a single outlier moves at most one slice median, and the
slope median ignores up to ~29% of wild slices, where a least-squares line swings with one
far point. The trend counts only while the newest level is still on the fitted line (after
a crash frees memory, the earlier climb predicts nothing).
"""

from __future__ import annotations

from detectors.common import (
    median,
    node_runs,
    node_subject,
    run_subject,
    series_index,
    unique_events,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding

USED, TOTAL = "gpu.mem_used_bytes", "gpu.mem_total_bytes"
GIB = 2**30
SLICES = 12


def slope(points: list[tuple[float, float]]) -> float:
    """Robust slope of value over time (units per second): Theil–Sen over slice medians
    (see the module docstring); 0 for < 2 distinct times."""
    return trend(points)[0]


def trend(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, the fitted value at the newest time) of `points`, oldest first."""
    if not points:
        return 0.0, 0.0
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
    return rate, median([v + rate * (last - t) for t, v in centres])


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
    for (node, gpu, _), series in sorted(used_series, key=lambda kv: str(kv[0])):
        total_series = index.get((node, gpu, TOTAL))
        if not series.points or total_series is None:
            continue
        total = total_series.points[-1][1] if total_series.points else 0.0
        if total <= 0:
            continue
        last_ts = series.points[-1][0]
        used = median([v for _, v in series.points[-3:]])
        share = used / total
        cutoff = last_ts - config.oom_trend_window_s
        recent = [p for p in series.points if p[0] >= cutoff]
        rate, fitted = 0.0, used
        if len(recent) >= config.oom_trend_min_points and recent[-1][0] > recent[0][0]:
            # The rate between the medians of both ends screens out flat series cheaply.
            first = median([v for _, v in recent[:3]])
            rough = (used - first) / (last_ts - recent[0][0])
            if rough > 0 and (total - used) / rough <= 3 * config.oom_horizon_s:
                rate, fitted = trend(recent)
        # A trend only counts while memory is still on it: after a crash frees it, the
        # earlier climb no longer predicts anything.
        rising = rate > 0 and used >= fitted - 0.03 * total
        eta = max(0.0, total - fitted) / rate if rising else None
        if share < config.oom_mem_share and (eta is None or eta > config.oom_horizon_s):
            continue
        summary = f"GPU {gpu} of {node} uses {share:.0%} of its memory"
        if share >= config.oom_mem_share:
            since = next(
                (t for t, v in series.points if v / total >= config.oom_mem_share), last_ts
            )
        else:
            since = recent[0][0]
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
