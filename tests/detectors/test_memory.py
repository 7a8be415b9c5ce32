"""GPU memory: near the total, climbing towards it, and OOM events."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import memory
from detectors.config import DEFAULT_CONFIG
from detectors.types import EventRow
from tests.detectors.builders import T0, cluster, run, series, steps

TOTAL = 80 * 2**30


def findings(used, total=TOTAL, events=(), runs=()):
    telemetry = [
        series("n1", "gpu.mem_used_bytes", used, gpu=3),
        series("n1", "gpu.mem_total_bytes", [total] * len(used), gpu=3),
    ]
    return memory.detect(cluster(*runs, telemetry=telemetry, events=events), T0 + 10 * len(used))


def test_steady_use_is_fine():
    assert findings([0.78 * TOTAL * (1 + 0.002 * (-1) ** i) for i in range(30)]) == []


@pytest.mark.parametrize(("share", "expected"), [(0.94, 0), (0.96, 1)])
def test_it_flags_a_gpu_near_its_total(share, expected):
    found = findings([share * TOTAL] * 5)
    assert len(found) == expected
    if expected:
        (f,) = found
        assert f.kind == "oom_risk" and f.subject == "node:n1/gpu:3" and f.gpu == 3
        assert f.evidence["share"] == pytest.approx(0.96) and "96%" in f.summary


@pytest.mark.parametrize(("minutes_to_full", "expected"), [(12, 0), (8, 1)])
def test_it_extrapolates_a_linear_climb(minutes_to_full, expected):
    # 10 points from 70 %, each 10 s apart, reaching the total `minutes_to_full` later.
    rate = 0.3 * TOTAL / (90 + minutes_to_full * 60)
    used = [0.7 * TOTAL + rate * 10 * i for i in range(10)]
    found = findings(used)
    assert len(found) == expected
    if expected:
        assert found[0].evidence["seconds_to_full"] == pytest.approx(minutes_to_full * 60, rel=0.01)


def test_memory_freed_by_a_crash_is_no_trend():
    used = [0.7 * TOTAL + 0.03 * TOTAL * i for i in range(9)] + [0.01 * TOTAL] * 3
    assert findings(used) == []


def test_each_oom_event_is_critical_and_names_rank_and_node():
    rows = steps(count=3)
    oom = EventRow(T0 + 50, "oom", "n1", run="r", rank=11, data={"message": "CUDA out of memory"})
    found = findings([0.5 * TOTAL] * 3, runs=[run(rows, [oom])], events=[oom])
    (f,) = found  # listed twice, reported once
    assert f.kind == "oom" and f.severity == "critical" and f.subject == "run:r/rank:11"
    assert "rank 11 on n1" in f.summary and f.evidence["message"] == "CUDA out of memory"


@st.composite
def gpu_memory(draw: st.DrawFn) -> tuple[list[float], list[float], float]:
    """One GPU's used memory (flat, climbing from some sample on, near full, or dropping
    after a crash; with jitter and stray readings), its total, and the sample interval."""
    count = draw(st.integers(0, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    total = draw(st.sampled_from([0.0, float(TOTAL), 16.0 * 2**30]))
    level = draw(st.floats(0.05, 0.99)) * (total or TOTAL)
    onset = draw(st.integers(0, count + 1))
    rate = draw(st.sampled_from([0.0, 1e6, 5e7, 3e8])) * rng.uniform(0.5, 1.5)
    every = draw(st.sampled_from([1.0, 2.0, 10.0]))
    used = level + rng.normal(0.0, draw(st.sampled_from([0.0, 1e6, 1e8])), count)
    used += np.where(np.arange(count) >= onset, rate * every * (np.arange(count) - onset), 0.0)
    if draw(st.booleans()) and count > 3:
        used[-draw(st.integers(1, 3)) :] = 0.01 * (total or TOTAL)  # a crash freed it
    totals = [total] * draw(st.integers(0, 3))
    return used.tolist(), totals, every


@settings(max_examples=300, deadline=None)
@given(st.lists(gpu_memory(), min_size=1, max_size=6))
def test_the_screen_of_every_gpu_at_once_keeps_each_gpu_memory_finds(gpus):
    """`memory._may_risk` screens all GPUs in numpy before any is fitted: every GPU with an
    `oom_risk` finding passed it (a GPU it drops would have found nothing)."""
    telemetry = []
    for gpu, (used, totals, every) in enumerate(gpus):
        telemetry.append(series("n1", "gpu.mem_used_bytes", used, gpu=gpu, every=every))
        telemetry.append(series("n1", "gpu.mem_total_bytes", totals, gpu=gpu, every=every))
    window = cluster(telemetry=telemetry)
    end = max((len(used) * every for used, _, every in gpus), default=0.0)
    found = {f.gpu for f in memory.detect(window, T0 + end) if f.kind == "oom_risk"}
    candidates = [(gpu, s) for gpu, s in enumerate(telemetry[::2]) if len(s)]
    totals = [gpus[gpu][1][-1] if gpus[gpu][1] else 0.0 for gpu, _ in candidates]
    kept = [
        (gpu, s, total) for (gpu, s), total in zip(candidates, totals, strict=True) if total > 0
    ]
    may = memory._may_risk([s for _, s, _ in kept], [t for *_, t in kept], DEFAULT_CONFIG)
    assert found <= {gpu for (gpu, _, _), yes in zip(kept, may, strict=True) if yes}
