"""GPU memory: `oom_risk` before an out-of-memory error, `oom` once one happened."""

from __future__ import annotations

from detectors.common import node_runs, node_subject, run_subject, series_index, unique_events
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding

USED, TOTAL = "gpu.mem_used_bytes", "gpu.mem_total_bytes"
GIB = 2**30


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of value over time (units per second); 0 for < 2 distinct times."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


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
    for (node, gpu, metric), series in sorted(index.items(), key=lambda kv: str(kv[0])):
        total_series = index.get((node, gpu, TOTAL))
        if metric != USED or not series.points or total_series is None:
            continue
        total = total_series.points[-1][1] if total_series.points else 0.0
        if total <= 0:
            continue
        last_ts, used = series.points[-1]
        share = used / total
        recent = [p for p in series.points if p[0] >= last_ts - config.oom_trend_window_s]
        rate = 0.0
        if len(recent) >= config.oom_trend_min_points and recent[-1][0] > recent[0][0]:
            # The end-to-end rate screens out flat series before the least-squares fit.
            rough = (used - recent[0][1]) / (last_ts - recent[0][0])
            if rough > 0 and (total - used) / rough <= 3 * config.oom_horizon_s:
                rate = slope(recent)
        # A trend only counts while memory is still at its high: after a crash frees it,
        # the earlier climb no longer predicts anything.
        rising = rate > 0 and used >= 0.99 * max(v for _, v in recent)
        eta = (total - used) / rate if rising else None
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
