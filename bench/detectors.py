"""How long `detect_all` takes on a large run: 1,024 ranks on 128 nodes × 8 GPUs.

Builds one window as the alerts service would hand it over: 60 steps × 1,024 ranks (with
checksums and canaries every 10 steps, and one straggling rank so the straggler detector
walks every step), 5 minutes of telemetry every 10 s for 128 nodes × 8 GPUs (10 GPU and
7 host metrics), node heartbeats and a few checkpoint events. Prints the time of
`detect_all` (median and best of several runs, one core) against the 100 ms target, and the
time of each detector. Run: python bench/detectors.py [--ranks 4096]

With `--clusters N` (bench/detectors_fleet.py): N clusters of 256 ranks in Postgres, evaluated
one task per cluster by 2 periodic Celery workers, against the 5 s evaluation period.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from itertools import chain
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.core.heap import gc_paused  # noqa: E402
from detectors import DETECTORS, StepResults, detect_all  # noqa: E402
from detectors.common import by_step, row_nodes, shared_results, use_step_groups  # noqa: E402
from detectors.config import DEFAULT_CONFIG  # noqa: E402
from detectors.goodput import goodput  # noqa: E402
from detectors.types import (  # noqa: E402
    ClusterWindow,
    EventRow,
    NodeSeen,
    RunWindow,
    Series,
    StepRow,
)

NODES, GPUS, STEPS, CHECK_EVERY = 128, 8, 60, 10
TELEMETRY_S, INTERVAL = 300, 10.0
T0 = 1_764_470_000.0
TARGET_MS = 100.0
GPU_METRICS = {
    "gpu.util": 96.0,
    "gpu.mem_used_bytes": 0.78 * 80 * 2**30,
    "gpu.mem_total_bytes": 80 * 2**30,
    "gpu.temp_c": 63.0,
    "gpu.power_w": 630.0,
    "gpu.power_limit_w": 700.0,
    "gpu.sm_clock_mhz": 1980.0,
    "gpu.throttle_reasons": 0.0,
    "gpu.nvlink_tx_bytes_per_s": 4.5e10,
    "gpu.nvlink_rx_bytes_per_s": 4.5e10,
}
HOST_METRICS = {
    "host.cpu_util": 22.0,
    "host.mem_used_bytes": 6.6e11,
    "host.mem_total_bytes": 2.2e12,
    "host.net_rx_bytes_per_s": 1.2e10,
    "host.net_tx_bytes_per_s": 1.2e10,
    "host.disk_read_bytes_per_s": 4e8,
    "host.disk_write_bytes_per_s": 2e7,
}


def build(seed: int = 0, nodes: int = NODES, steps: int = STEPS) -> tuple[ClusterWindow, float]:
    rng = random.Random(seed)
    ranks = nodes * GPUS
    node = [f"node-{r // GPUS:03d}" for r in range(ranks)]
    rows = []
    t = T0
    for step in range(steps):
        ready = {}
        for r in range(ranks):
            compute = 0.80 * (1 + 0.01 * rng.uniform(-1, 1)) * (1.35 if r == 517 else 1.0)
            ready[r] = (0.03 * (1 + 0.1 * rng.uniform(-1, 1)), 0.01, compute)
        step_time = max(map(sum, ready.values())) + 0.14
        t += step_time
        checked = step % CHECK_EVERY == 0
        for r, (data, h2d, compute) in ready.items():
            extra: dict = {}
            if checked:
                extra = {
                    "grad_checksum": f"g{step}",
                    "param_checksum": f"p{step}",
                    "canary_norm": 3.04 * (1 + 1e-7 * rng.uniform(-1, 1)),
                    "canary_proj": (0.125, -0.872, 0.0431, 1.502),
                }
            rows.append(
                StepRow(
                    node=node[r],
                    rank=r,
                    step=step,
                    ts=t,
                    step_time=step_time,
                    data_time=data,
                    h2d_time=h2d,
                    compute_time=compute,
                    comm_wait=step_time - data - h2d - compute,
                    tokens=32768,
                    loss=2.3,
                    shard="tp0-pp0",
                    **extra,
                )
            )
    now = t + 0.5
    times = [now - TELEMETRY_S + i * INTERVAL for i in range(int(TELEMETRY_S / INTERVAL))]
    telemetry = []
    for n in range(nodes):
        name = f"node-{n:03d}"
        for metric, base in HOST_METRICS.items():
            telemetry.append(Series(name, metric, None, tuple((ts, base) for ts in times)))
        for gpu in range(GPUS):
            for metric, base in GPU_METRICS.items():
                points = tuple((ts, base * (1 + 0.002 * rng.uniform(-1, 1))) for ts in times)
                telemetry.append(Series(name, metric, gpu, points))
    events = (
        EventRow(
            T0 + 5,
            "checkpoint",
            "node-000",
            run="big",
            step=1,
            data={"tier": "local", "state": "completed"},
        ),
        EventRow(
            T0 + 25,
            "checkpoint",
            "node-000",
            run="big",
            step=1,
            data={"tier": "durable", "state": "completed"},
        ),
    )
    run = RunWindow("big", ranks, T0, tuple(rows), events, dict(enumerate(node)))
    seen = tuple(NodeSeen(f"node-{n:03d}", now - 3, 10.0) for n in range(nodes))
    return ClusterWindow("bench", (run,), tuple(telemetry), seen, ()), now


def shifted(window: ClusterWindow, start: int, count: int) -> ClusterWindow:
    """The window with only steps [start, start + count) of its run, grouped as the live
    loader keeps them (RunWindow.by_step): the lists are the same objects in every window
    cut from one `grouped`, as the live loader hands over a step that did not change."""
    run = window.runs[0]
    grouped = _GROUPS.setdefault(id(run), by_step(run.steps))
    kept = {n: grouped[n] for n in sorted(grouped)[start : start + count]}
    steps = tuple(chain.from_iterable(kept.values()))
    cut = replace(run, steps=steps, by_step=kept, rank_nodes=row_nodes(steps))
    return replace(window, runs=(cut,))


_GROUPS: dict[int, dict] = {}


def incremental(window: ClusterWindow, now: float, new_steps: int) -> None:
    """CPU of a pass that keeps per-step results (detectors.StepResults) after `new_steps`
    steps arrived since the previous one, against a pass from cold, over the same window."""
    kept = StepResults()
    cold, warm = [], []
    for i in range(6):
        before = shifted(window, i * new_steps, STEPS)
        after = shifted(window, (i + 1) * new_steps, STEPS)
        assert detect_all(after, now) == detect_all(after, now, kept=StepResults())
        detect_all(before, now, kept=kept)
        with gc_paused():
            start = time.process_time()
            detect_all(after, now, kept=kept)
            warm.append((time.process_time() - start) * 1000)
        with gc_paused():
            start = time.process_time()
            detect_all(after, now)
            cold.append((time.process_time() - start) * 1000)
    ratio = statistics.median(warm) / statistics.median(cold)
    print(
        f"detect_all, {new_steps} new steps since the last pass: kept results "
        f"{statistics.median(warm):.1f} ms median ({min(warm):.1f} best), from cold "
        f"{statistics.median(cold):.1f} ms median, ratio {ratio:.2f}"
    )
    for detector in DETECTORS:
        ms = []
        for i in range(3):
            before = shifted(window, i * new_steps, STEPS)
            after = shifted(window, (i + 1) * new_steps, STEPS)
            with shared_results(kept):
                use_step_groups(before)
                detector(before, now, DEFAULT_CONFIG)
            with gc_paused():
                start = time.process_time()
                with shared_results(kept):
                    use_step_groups(after)
                    detector(after, now, DEFAULT_CONFIG)
                ms.append((time.process_time() - start) * 1000)
        print(f"  {detector.__module__:<24} {statistics.median(ms):6.1f} ms (kept)")


def timed(fn, repeat: int) -> list[float]:
    """CPU milliseconds of each of `repeat` calls, each from a cold cache (as a fresh
    window would be: a pass's shared results live only inside its detect_all), with the
    cyclic collector paused as the periodic worker pauses it for a pass."""
    out = []
    for _ in range(repeat):
        with gc_paused():
            start = time.process_time()
            fn()
            out.append((time.process_time() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, help="ranks (1,024; with --clusters: 256 each)")
    parser.add_argument(
        "--clusters",
        type=int,
        help="N clusters, a task each, on 2 periodic workers (bench/detectors_fleet.py)",
    )
    parser.add_argument(
        "--new-steps",
        type=int,
        default=5,
        help="steps arrived between two passes, for the pass with kept results (5)",
    )
    parser.add_argument("--ticks", type=int, default=6, help="with --clusters: beat ticks (6)")
    parser.add_argument(
        "--sample-interval", type=float, default=10.0, help="with --clusters: seconds (10)"
    )
    args = parser.parse_args()
    if args.clusters:
        from bench.detectors_fleet import main as fleet

        fleet(
            clusters=args.clusters,
            ranks=args.ranks or 256,
            ticks=args.ticks,
            interval=args.sample_interval,
        )
        return
    args.ranks = args.ranks or NODES * GPUS
    started = time.perf_counter()
    extra = 7 * args.new_steps  # the incremental passes slide the window this far
    full, now = build(nodes=max(1, args.ranks // GPUS), steps=STEPS + extra)
    window = shifted(full, extra, STEPS)
    rows = len(window.runs[0].steps)
    points = sum(len(s.points) for s in window.telemetry)
    print(
        f"window: {window.runs[0].world_size:,} ranks, {rows:,} step rows, "
        f"{len(window.telemetry):,} series, {points:,} points "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    findings = detect_all(window, now)
    print("findings:", [(f.kind, f.subject) for f in findings])
    runs = timed(lambda: detect_all(window, now), 15)
    print(
        f"detect_all: median {statistics.median(runs):.1f} ms, best {min(runs):.1f} ms "
        f"of CPU time (target < {TARGET_MS:.0f} ms)"
    )
    for detector in DETECTORS:
        ms = statistics.median(timed(lambda d=detector: d(window, now, DEFAULT_CONFIG), 5))
        print(f"  {detector.__module__:<24} {ms:6.1f} ms")
    ms = statistics.median(timed(lambda: goodput(window.runs[0], now), 5))
    print(f"  {'detectors.goodput':<24} {ms:6.1f} ms")
    incremental(full, now, args.new_steps)


if __name__ == "__main__":
    main()
