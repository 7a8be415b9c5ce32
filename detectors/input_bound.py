"""Input bound: training waits for data rather than computing.

Two signals: the step reports' (data_time + h2d_time) share of the step, median over the
last `input_steps` steps of a node's ranks; and the host's CPUs saturated while its GPUs
idle, sustained. The finding says which stage dominates: loading (waiting for the data
loader) or staging (host-to-device copies).

Why it holds under noise: both are window statistics. The step signal is a median over
the node's ranks, then over 20 steps: one slow data fetch (a page-fault storm, a cold
cache) moves it by at most one place, and a real input bottleneck over most steps is found
however a few of them jitter. The host signal counts as sustained when at least
`sustain_share` of the samples of the last `input_sustain_s` seconds are over the line
(`sustained.sustained`), so a single busy or idle sample neither makes nor breaks it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from detectors.common import (
    by_step,
    median,
    node_runs,
    node_subject,
    pct,
    per_step,
    rank_nodes,
    run_subject,
    series_index,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.sustained import over, sustained_where, under
from detectors.types import ClusterWindow, Finding, RunWindow, Series, StepRow


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Warnings: one per input-bound node of a run (`run:<run>/node:<n>`), or one for the run
    (`run:<run>`) when all its nodes are; a node whose host alone shows it (CPU busy, GPUs
    idle) gets `node:<n>`. Evidence: the shares of the step, the dominant stage, host
    utilisation when known."""
    hosts = _host_starved(window, config)
    findings: list[Finding] = []
    covered: set[str] = set()
    for run in window.runs:
        found = _from_steps(run, config)
        nodes = sorted(found)
        all_nodes = set(rank_nodes(run).values())
        if nodes and set(nodes) == all_nodes and len(nodes) > 1:
            merged = {"nodes": nodes, **_merge([found[n] for n in nodes])}
            findings.append(_finding(run.run, None, merged, hosts))
        else:
            findings += [_finding(run.run, n, found[n], hosts) for n in nodes]
        covered.update(nodes)
    runs_of = node_runs(window)
    for node in sorted(hosts.keys() - covered):
        host = hosts[node]
        findings.append(
            Finding(
                kind="input_bound",
                subject=node_subject(node),
                severity="warning",
                summary=(
                    f"{node}'s CPUs are {host['host_cpu_util']:.0f}% busy while its GPUs are "
                    f"{host['gpu_util']:.0f}% utilised: the input pipeline is CPU-bound"
                ),
                run=runs_of.get(node),
                node=node,
                evidence={"node": node, **host},
                since=host["since"],
            )
        )
    return findings


def _from_steps(run: RunWindow, config: DetectorConfig) -> dict[str, dict[str, Any]]:
    """node → evidence, for the nodes whose ranks wait for input too much of the step."""
    steps = by_step(run.steps)
    recent = sorted(steps)[-config.input_steps :]
    if len(recent) < config.input_steps:
        return {}
    # No single report over the share: no node's median can be either.
    limit = config.input_share
    if not any(per_step(f"input_over:{limit}", steps[n], _over(steps[n], limit)) for n in recent):
        return {}
    rows = [r for n in recent for r in steps[n] if r.step_time > 0]
    rows_of: dict[str, list[StepRow]] = defaultdict(list)
    for row in rows:
        if row.data_time is not None or row.h2d_time is not None:
            rows_of[row.node].append(row)
    out: dict[str, dict[str, Any]] = {}
    for node, node_rows in rows_of.items():
        mine: dict[int, list[StepRow]] = defaultdict(list)
        for row in node_rows:
            mine[row.step].append(row)
        data, h2d = [], []
        for number in recent:
            group = mine.get(number)
            if group:
                data.append(median([(r.data_time or 0.0) / r.step_time for r in group]))
                h2d.append(median([(r.h2d_time or 0.0) / r.step_time for r in group]))
        if not data:
            continue
        share = median([d + h for d, h in zip(data, h2d, strict=True)])
        if share >= config.input_share:
            out[node] = {
                "input_share": round(share, 4),
                "data_share": round(median(data), 4),
                "h2d_share": round(median(h2d), 4),
                "steps": len(recent),
                "since_step": recent[0],
                "since": min(r.ts for r in node_rows),
            }
    return out


def _over(rows: list[StepRow], share: float) -> Callable[[], bool]:
    """Whether any report of the step waits for input `share` of its step or more."""
    return lambda: any(
        (r.data_time or 0.0) + (r.h2d_time or 0.0) >= share * r.step_time
        for r in rows
        if r.step_time > 0
    )


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("input_share", "data_share", "h2d_share")
    merged = {k: round(median([p[k] for p in parts]), 4) for k in keys}
    merged.update(steps=min(p["steps"] for p in parts), since=min(p["since"] for p in parts))
    merged["since_step"] = min(p["since_step"] for p in parts)
    return merged


def _host_starved(window: ClusterWindow, config: DetectorConfig) -> dict[str, dict[str, Any]]:
    """node → host evidence, for nodes whose CPUs stay busy while most GPUs idle. Reads
    the series' columns with numpy: every GPU's utilisation is looked at every pass."""
    index = series_index(window)
    gpus: dict[str, list[Series]] = defaultdict(list)
    for series in window.telemetry:
        if series.metric == "gpu.util" and series.gpu is not None and len(series):
            gpus[series.node].append(series)
    out: dict[str, dict[str, Any]] = {}
    for node, utils in gpus.items():
        cpu = index.get((node, None, "host.cpu_util"))
        if cpu is None or not len(cpu):
            continue
        span, share = config.input_sustain_s, config.sustain_share
        busy_of = partial(over, limit=config.input_cpu_util)
        busy_since = sustained_where(cpu.times, cpu.values, busy_of, span, share)
        if busy_since is None:
            continue
        idle_of = partial(under, limit=config.input_gpu_util)
        idle = [sustained_where(u.times, u.values, idle_of, span, share) for u in utils]
        long_idle = [s for s in idle if s is not None]
        if len(long_idle) * 2 <= len(utils):
            continue
        out[node] = {
            "host_cpu_util": round(cpu.values[-1].item(), 1),
            "gpu_util": round(median([u.values[-1].item() for u in utils]), 1),
            "gpus_idle": len(long_idle),
            "gpus": len(utils),
            "since": max(busy_since, min(long_idle)),
        }
    return out


def _finding(
    run: str, node: str | None, found: dict[str, Any], hosts: dict[str, dict[str, Any]]
) -> Finding:
    loading = found["data_share"] >= found["h2d_share"]
    stage = "loading" if loading else "staging"
    why = "the data loader cannot keep up" if loading else "host-to-device copies are slow"
    evidence: dict[str, Any] = {"stage": stage, **found}
    if node is not None and node in hosts:
        evidence["host"] = hosts[node]
    who = f"{node}'s ranks" if node else f"every node of {run}"
    return Finding(
        kind="input_bound",
        subject=run_subject(run, node=node),
        severity="warning",
        summary=(
            f"{who} wait for input {pct(found['input_share'])} of each step, mostly {stage}: {why}"
        ),
        run=run,
        node=node,
        evidence=evidence,
        since=found["since"],
    )
