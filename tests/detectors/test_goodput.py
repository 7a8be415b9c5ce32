"""Goodput: productive time over wall time, and the badput buckets."""

from __future__ import annotations

import pytest

from detectors.goodput import BUCKETS, goodput
from detectors.types import EventRow
from tests.detectors.builders import T0, last_ts, run
from tests.detectors.builders import steps as _steps


def steps(**kwargs):
    """Steps of exactly 1.0 s (0.03 data + 0.01 h2d + 0.82 compute + 0.14 comm)."""
    return _steps(compute=lambda r, s: 0.82, **kwargs)


def test_a_healthy_run_loses_only_its_input_wait():
    rows = steps(count=100)  # 1.0 s steps, 0.04 s of them input
    g = goodput(run(rows), last_ts(rows))
    assert g.wall == pytest.approx(100.0)
    assert g.goodput == pytest.approx(0.96)
    assert g.badput["data"] == pytest.approx(4.0)
    assert sum(g.badput.values()) + g.productive == pytest.approx(g.wall)
    assert set(g.fractions) == set(BUCKETS)


def test_a_restart_counts_recovery_and_the_steps_it_lost_as_recovery():
    before = steps(count=50)  # steps 0..49, ends at T0 + 50
    # crash at +50, restart event at +60, resumes from the step-40 checkpoint at +90
    after = steps(count=30, first=40, start=T0 + 90)
    restart = EventRow(T0 + 60, "restart", "n0", run="r")
    g = goodput(run(before + after, [restart]), last_ts(after))
    # restart → next step (30 s), and steps 40..49, done and lost, to be done again (10 s)
    assert g.badput["recovery"] == pytest.approx(40.0)
    assert g.badput["idle"] == pytest.approx(10.0)  # crash → restart
    assert g.productive == pytest.approx(70 * 0.96)  # steps 0..39 and 40..69 once each
    assert g.wall == pytest.approx(120.0)
    assert sum(g.badput.values()) + g.productive == pytest.approx(g.wall)


def test_a_long_stall_is_a_hang_and_a_blocking_save_is_checkpoint_time():
    first = steps(count=20)
    second = steps(count=20, first=20, start=T0 + 20 + 300)
    saves = [
        EventRow(
            T0 + 20,
            "checkpoint",
            "n0",
            run="r",
            step=19,
            data={"tier": "local", "state": "started"},
        ),
        EventRow(
            T0 + 50,
            "checkpoint",
            "n0",
            run="r",
            step=19,
            data={"tier": "local", "state": "completed"},
        ),
    ]
    g = goodput(run(first + second, saves), last_ts(second))
    assert g.badput["checkpoint"] == pytest.approx(30.0)
    assert g.badput["hang"] == pytest.approx(270.0)
    assert g.to_dict()["goodput"] == pytest.approx(40 * 0.96 / 340, abs=1e-4)
