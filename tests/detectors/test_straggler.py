"""Straggler: one slow rank, a slow node, and what must not be called a straggler."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import straggler
from detectors.types import Finding
from tests.detectors.builders import cluster, last_ts, run, steps


def findings(rows) -> list[Finding]:
    return straggler.detect(cluster(run(rows)), last_ts(rows))


def slow(rank: int, factor: float, from_step: int = 0):
    return lambda r, s: 0.80 * (factor if r == rank and s >= from_step else 1.0)


def test_it_finds_nothing_in_a_healthy_run():
    assert findings(steps()) == []


@pytest.mark.parametrize(("factor", "expected"), [(1.14, 0), (1.16, 1), (1.35, 1)])
def test_it_flags_a_rank_only_past_the_slowdown_threshold(factor, expected):
    assert len(findings(steps(compute=slow(13, factor)))) == expected


@pytest.mark.parametrize(("slow_steps", "expected"), [(19, 0), (20, 1)])
def test_it_needs_the_configured_number_of_consecutive_slow_steps(slow_steps, expected):
    rows = steps(count=40, compute=slow(13, 1.35, from_step=40 - slow_steps))
    assert len(findings(rows)) == expected


def test_a_single_fast_step_breaks_the_streak():
    rows = steps(count=40, compute=lambda r, s: 0.80 * (1.35 if r == 13 and s != 30 else 1.0))
    assert findings(rows) == []  # only steps 31..39 are slow in a row


def test_it_names_the_rank_its_node_and_the_cost():
    (finding,) = findings(steps(compute=slow(13, 1.35)))
    assert finding.kind == "straggler" and finding.subject == "run:r/rank:13"
    assert finding.rank == 13 and finding.node == "n1" and finding.run == "r"
    assert "rank 13 on n1" in finding.summary and "35% slower" in finding.summary
    ev = finding.evidence
    assert ev["slowdown"] == pytest.approx(0.35, abs=1e-3)
    assert ev["steps"] == 40 and ev["since_step"] == 0
    # 16 ranks each wait 0.28 s of a 1.26 s step for it.
    assert ev["gpu_hours_lost_per_hour"] == pytest.approx(16 * 0.28 / 1.26, rel=1e-3)


def test_it_uses_step_time_minus_comm_wait_without_compute_time():
    rows = [
        r.__class__(**{**r.__dict__, "compute_time": None}) for r in steps(compute=slow(2, 1.3))
    ]
    (finding,) = findings(rows)
    assert finding.rank == 2


def test_it_reports_a_slow_node_once_instead_of_each_rank():
    rows = steps(ranks=24, compute=lambda r, s: 0.80 * (1.3 if 8 <= r < 16 else 1.0))
    (finding,) = findings(rows)
    assert finding.subject == "run:r/node:n1" and finding.node == "n1" and finding.rank is None
    assert "node n1 is slow" in finding.summary
    assert finding.evidence["ranks"] == list(range(8, 16))


def test_it_compares_with_the_peers_even_when_half_the_run_is_slow():
    rows = steps(ranks=16, compute=lambda r, s: 0.80 * (1.3 if r >= 8 else 1.0))
    (finding,) = findings(rows)
    assert finding.subject == "run:r/node:n1"


def test_a_gradual_slowdown_counts_from_the_step_it_crossed_the_threshold():
    rows = steps(count=60, compute=lambda r, s: 0.80 * (1 + min(0.4, s / 50) if r == 3 else 1))
    (finding,) = findings(rows)
    assert finding.rank == 3 and finding.evidence["since_step"] == 8  # 8 / 50 >= 0.15


@settings(max_examples=40, deadline=None)
@given(
    st.permutations(list(range(16))),
    st.integers(0, 15),
    st.floats(1.2, 2.0),
)
def test_permuting_rank_numbers_permutes_the_findings(perm, culprit, factor):
    plain = findings(steps(count=25, compute=slow(culprit, factor)))
    shuffled = findings(steps(count=25, compute=slow(culprit, factor), rank_of=perm.__getitem__))
    assert [f.rank for f in plain] == [culprit]
    assert [f.rank for f in shuffled] == [perm[culprit]]


@settings(max_examples=40, deadline=None)
@given(st.floats(1.0, 3.0), st.lists(st.floats(-0.01, 0.01), min_size=16, max_size=16))
def test_a_uniform_slowdown_is_never_a_straggler(factor, wobble):
    rows = steps(count=25, compute=lambda r, s: 0.80 * factor * (1 + wobble[r]))
    assert findings(rows) == []


def test_a_threshold_can_be_overridden_per_cluster():
    from detectors.config import DetectorConfig

    rows = steps(compute=slow(13, 1.12))
    config = DetectorConfig().with_overrides({"straggler_slowdown": 0.1})
    assert len(straggler.detect(cluster(run(rows)), last_ts(rows), config)) == 1
