"""The package as a whole: purity, configuration, detect_all."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import detectors
from detectors.common import by_step, shared_results
from detectors.config import DetectorConfig, config_for
from detectors.types import StepRow
from tests.detectors.builders import cluster, last_ts, run, series, steps

ROOT = Path(__file__).resolve().parents[2]


def test_it_imports_nothing_from_django():
    code = (
        "import sys, detectors, detectors.goodput; "
        "bad = [m for m in sys.modules if m.startswith(('django', 'apps', 'opsboard'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_overrides_apply_per_cluster_and_reject_typos():
    overrides = {"big": {"hang_min_s": 600, "straggler_steps": 50}}
    assert config_for("small", overrides) == DetectorConfig()
    big = config_for("big", overrides)
    assert big.hang_min_s == 600.0 and big.straggler_steps == 50
    with pytest.raises(ValueError, match="unknown"):
        DetectorConfig().with_overrides({"hang_min": 1})
    with pytest.raises(ValueError):
        DetectorConfig().with_overrides({"straggler_steps": 2.5})


def test_detect_all_orders_findings_and_keeps_one_per_subject():
    rows = steps(count=30, compute=lambda r, s: 0.8 * (1.5 if r in (2, 9) else 1.0))
    found = detectors.detect_all(cluster(run(rows)), last_ts(rows))
    assert [(f.kind, f.subject) for f in found] == [
        ("straggler", "run:r/rank:2"),
        ("straggler", "run:r/rank:9"),
    ]
    assert detectors.detect_all(cluster(), 0.0) == []


def test_a_pass_keeps_nothing_of_its_window():
    # what the detectors share (groupings, indexes) lives for one pass: a cache that outlived
    # it kept the last passes' telemetry alive in the periodic worker (docs/faults.md, 10)
    rows = steps(count=30)
    temps = series("n0", "gpu.temp_c", [60.0] * 30, every=1.0)
    window = cluster(run(rows), telemetry=[temps])
    held = [window.telemetry, window.runs, window.runs[0].steps]
    before = [sys.getrefcount(item) for item in held]

    detectors.detect_all(window, last_ts(rows))

    assert [sys.getrefcount(item) for item in held] == before


def test_results_are_shared_within_a_pass_only():
    rows = steps(count=5)
    with shared_results():
        assert by_step(rows) is by_step(rows)
    assert by_step(rows) is not by_step(rows)


@settings(max_examples=200, deadline=None)
@given(numbers=st.lists(st.integers(min_value=0, max_value=6), max_size=40))
def test_by_step_groups_rows_in_any_order_as_one_by_one_grouping(numbers):
    rows = tuple(
        StepRow(node="n", rank=index, step=number, ts=float(index), step_time=1.0)
        for index, number in enumerate(numbers)
    )
    expected: dict[int, list[StepRow]] = {}
    for row in rows:
        expected.setdefault(row.step, []).append(row)
    got = by_step(rows)
    assert got == expected and list(got) == list(expected)
    assert by_step(iter(rows)) == expected  # a one-shot iterable too


@settings(max_examples=25, deadline=None)
@given(
    slow=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 89)), max_size=60),
    hungry=st.lists(st.integers(0, 89), max_size=30),
    moves=st.lists(st.integers(1, 12), min_size=3, max_size=8),
    rewritten=st.integers(0, 59),
)
def test_kept_results_find_what_a_fresh_pass_finds(slow, hungry, moves, rewritten):
    """Windows sliding over a run with stragglers and input stalls that come and go, and a
    step whose reports change between passes (a new list, as the loader hands it over):
    every pass with kept per-step results equals a pass from nothing."""
    slow_at, hungry_at = set(slow), set(hungry)
    rows = steps(
        ranks=8,
        count=150,
        compute=lambda rank, step: 0.8 * (1.4 if (rank, step % 90) in slow_at else 1.0),
        data=lambda rank, step: 0.5 if step % 90 in hungry_at else 0.03,
    )
    grouped = by_step(rows)
    kept = detectors.StepResults()
    start = 0
    for index, move in enumerate(moves):
        start += move
        numbers = sorted(grouped)[start : start + 60]
        window_steps = {n: grouped[n] for n in numbers}
        if index == 1 and rewritten < len(numbers):  # a late report changed one step
            n = numbers[rewritten]
            window_steps[n] = [row._replace(compute_time=1.3) for row in grouped[n]]
        flat = tuple(row for group in window_steps.values() for row in group)
        fresh = cluster(run(flat))
        kept_window = cluster(replace(run(flat), by_step=window_steps))
        now = last_ts(flat) + 1
        assert detectors.detect_all(kept_window, now, kept=kept) == detectors.detect_all(fresh, now)
    assert len(kept) > 0
