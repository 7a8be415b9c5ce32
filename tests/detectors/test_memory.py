"""GPU memory: near the total, climbing towards it, and OOM events."""

from __future__ import annotations

import pytest

from detectors import memory
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
