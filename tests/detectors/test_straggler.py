"""Straggler: one slow rank, a slow node, and what must not be called a straggler."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import straggler
from detectors.types import Finding
from tests.detectors.builders import cluster, last_ts, run, steps
from tests.detectors.noise import jitter


def findings(rows) -> list[Finding]:
    return straggler.detect(cluster(run(rows)), last_ts(rows))


def slow(rank: int, factor: float, from_step: int = 0):
    return lambda r, s: 0.80 * (factor if r == rank and s >= from_step else 1.0)


def test_it_finds_nothing_in_a_healthy_run():
    assert findings(steps()) == []


@pytest.mark.parametrize(("factor", "expected"), [(1.14, 0), (1.16, 1), (1.35, 1)])
def test_it_flags_a_rank_only_past_the_slowdown_threshold(factor, expected):
    assert len(findings(steps(compute=slow(13, factor)))) == expected


@pytest.mark.parametrize(("slow_steps", "expected"), [(14, 0), (15, 1)])
def test_it_needs_a_clear_majority_of_the_last_steps_slow(slow_steps, expected):
    # 75% of the last 20 steps: 15
    rows = steps(count=40, compute=slow(13, 1.35, from_step=40 - slow_steps))
    assert len(findings(rows)) == expected


def test_a_single_fast_step_does_not_hide_a_straggler():
    rows = steps(count=40, compute=lambda r, s: 0.80 * (1.35 if r == 13 and s != 38 else 1.0))
    (finding,) = findings(rows)
    assert finding.rank == 13 and finding.evidence["slow_steps"] == 19


def test_slow_steps_scattered_through_the_window_count():
    # Every fourth step fast (jitter): 15 of the last 20 slow, never more than 3 in a row.
    rows = steps(count=40, compute=lambda r, s: 0.80 * (1.35 if r == 13 and s % 4 else 1.0))
    (finding,) = findings(rows)
    assert finding.rank == 13 and finding.evidence["slow_steps"] == 15


def test_a_single_slow_step_is_no_straggler():
    rows = steps(count=40, compute=lambda r, s: 0.80 * (5.0 if r == 13 and s == 39 else 1.0))
    assert findings(rows) == []


@pytest.mark.parametrize(("recovered", "expected"), [(19, 1), (20, 0)])
def test_it_resolves_only_once_the_rule_failed_for_a_full_window(recovered, expected):
    # Slow for steps 0-39, then healthy: the last window the rule holds in ends at step 44
    # (15 of 20 slow); the finding stands until a whole window has passed since then.
    rows = steps(
        count=45 + recovered, compute=lambda r, s: 0.80 * (1.35 if r == 13 and s < 40 else 1)
    )
    found = findings(rows)
    assert len(found) == expected
    if expected:
        assert found[0].evidence["holds_now"] is False and found[0].evidence["since_step"] == 0


def borderline(after: int):
    """Rank 13 slow in every step before `after`, then in 3 of every 5 (60%)."""
    return lambda r, s: 0.80 * (1.35 if r == 13 and (s < after or s % 5 < 3) else 1.0)


def test_a_rank_still_slow_in_most_steps_keeps_its_finding_past_the_grace():
    (finding,) = findings(steps(count=120, compute=borderline(after=40)))
    assert finding.rank == 13 and finding.evidence["holds_now"] is False
    assert finding.evidence["since_step"] == 0


def test_a_rank_slow_in_only_60_percent_of_steps_opens_nothing():
    assert findings(steps(count=120, compute=borderline(after=0))) == []


def test_it_names_the_rank_its_node_and_the_cost():
    (finding,) = findings(steps(compute=slow(13, 1.35)))
    assert finding.kind == "straggler" and finding.subject == "run:r/rank:13"
    assert finding.rank == 13 and finding.node == "n1" and finding.run == "r"
    assert "rank 13 on n1" in finding.summary and "35% slower" in finding.summary
    assert "(20 of 20 steps slow)" in finding.summary
    ev = finding.evidence
    assert ev["slowdown"] == pytest.approx(0.35, abs=1e-3)
    assert ev["steps"] == 20 and ev["slow_steps"] == 20 and ev["holds_now"] is True
    assert ev["since_step"] == 0 and ev["last_step"] == 39  # the episode began at step 0
    # 16 ranks each wait 0.28 s of a 1.26 s step for it.
    assert ev["gpu_hours_lost_per_hour"] == pytest.approx(16 * 0.28 / 1.26, rel=1e-3)


def test_it_keeps_the_configured_window_when_the_run_is_quiet():
    (finding,) = findings(steps(count=120, compute=slow(13, 1.35)))
    assert finding.evidence["window_steps"] == 20 and finding.evidence["noise_sigma"] == 0
    assert "(20 of 20 steps slow)" in finding.summary


def test_a_noisy_run_gets_a_longer_window_capped_at_half_the_steps_held():
    j = jitter(7, 0.3)
    rows = steps(count=120, compute=lambda r, s: 0.8 * j(r, s) * (2.0 if r == 13 else 1))
    (finding,) = findings(rows)
    assert finding.rank == 13 and finding.evidence["window_steps"] == 60
    assert finding.evidence["steps"] == 60 and "of 60 steps slow)" in finding.summary


def test_a_slow_node_is_not_mistaken_for_noise():
    # Half the ranks 30% slower: a steady offset per rank, not step-to-step jitter.
    rows = steps(count=120, ranks=16, compute=lambda r, s: 0.80 * (1.3 if r >= 8 else 1.0))
    (finding,) = findings(rows)
    assert finding.subject == "run:r/node:n1" and finding.evidence["window_steps"] == 20


def test_it_uses_step_time_minus_comm_wait_without_compute_time():
    rows = [r._replace(compute_time=None) for r in steps(compute=slow(2, 1.3))]
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
