"""The package as a whole: purity, configuration, detect_all."""

from __future__ import annotations

import subprocess
import sys
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
