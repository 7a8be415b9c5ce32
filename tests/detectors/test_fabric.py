"""Fabric: slower collectives with unchanged compute, and what is not the fabric."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import fabric, straggler
from tests.detectors.builders import cluster, last_ts, run, steps


def findings(rows):
    return fabric.detect(cluster(run(rows)), last_ts(rows))


def comm_after(factor: float, from_step: int = 20):
    return lambda step: 0.14 * (factor if step >= from_step else 1.0)


def test_it_finds_nothing_in_a_healthy_run():
    assert findings(steps(count=60)) == []


@pytest.mark.parametrize(("factor", "expected"), [(1.45, 0), (1.55, 1), (3.0, 1)])
def test_it_flags_collectives_slower_than_the_baseline(factor, expected):
    found = findings(steps(count=60, comm=comm_after(factor)))
    assert len(found) == expected
    if expected:
        (f,) = found
        assert f.subject == "run:r" and "interconnect" in f.summary
        assert f.evidence["rise"] == pytest.approx(factor - 1, rel=1e-6)


def test_it_needs_a_baseline_and_a_recent_stretch():
    assert findings(steps(count=39, comm=comm_after(3, 19))) == []


def test_a_straggler_is_not_the_fabric():
    rows = steps(count=60, compute=lambda r, s: 0.8 * (1.4 if r == 5 and s >= 20 else 1.0))
    assert findings(rows) == []
    assert [f.rank for f in straggler.detect(cluster(run(rows)), last_ts(rows))] == [5]


@settings(max_examples=30, deadline=None)
@given(st.floats(1.06, 2.0), st.floats(1.0, 4.0))
def test_a_uniform_compute_slowdown_is_neither_fabric_nor_straggler(slowdown, comm):
    rows = steps(
        count=60,
        compute=lambda r, s: 0.8 * (slowdown if s >= 20 else 1.0),
        comm=comm_after(comm),
    )
    window = cluster(run(rows))
    assert fabric.detect(window, last_ts(rows)) == []  # compute changed: not the fabric alone
    assert straggler.detect(window, last_ts(rows)) == []
