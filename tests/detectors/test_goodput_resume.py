"""A resume books the work it lost as recovery: the steps done past the checkpoint it
resumed from, whether the restart came as a `restart` event (supervise) or was inferred
from the step counter going back (Run.timeline_after), and never twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.goodput import INFERRED_AFTER_S, goodput, restarts_of
from detectors.types import EventRow
from tests.detectors.builders import T0, last_ts, run
from tests.detectors.builders import steps as _steps


def steps(**kwargs):
    """Steps of exactly 1.0 s, 0.04 s of them input, on 2 ranks."""
    return _steps(ranks=2, compute=lambda r, s: 0.82, **kwargs)


def test_steps_that_go_back_without_an_event_book_the_old_timeline_as_recovery():
    # the reproduction: steps 0..299 (until +300), then 0..89 from +400 on
    before = steps(count=300)
    after = steps(count=90, start=T0 + 400)
    window = run(before + after)
    g = goodput(window, last_ts(after), timeline_after=last_ts(before))
    # all 300 old steps were thrown away; the 100 s from the old timeline's last report to
    # the new one's first step are recovery too (no event says when the restart began)
    assert g.badput["recovery"] == pytest.approx(300.0 + 100.0)
    assert g.productive == pytest.approx(90 * 0.96)
    assert g.badput["idle"] == pytest.approx(0.0, abs=1e-3) and g.badput["hang"] == 0.0
    # without the inferred restart, the same step numbers would merge into one completion
    assert goodput(window, last_ts(after)).badput["recovery"] == 0.0


def test_a_restart_event_after_the_old_timeline_stands_for_the_inferred_one():
    before = steps(count=50)
    after = steps(count=30, first=40, start=T0 + 90)
    event = EventRow(T0 + 60, "restart", "n0", run="r")
    assert restarts_of([event], last_ts(before)) == [T0 + 60]
    assert restarts_of([], last_ts(before)) == [last_ts(before) + INFERRED_AFTER_S]
    with_both = goodput(run(before + after, [event]), last_ts(after), timeline_after=T0 + 50)
    with_event = goodput(run(before + after, [event]), last_ts(after))
    assert with_both == with_event
    assert with_event.badput["recovery"] == pytest.approx(30.0 + 10.0)


@settings(max_examples=60, deadline=None)
@given(
    crash=st.integers(min_value=12, max_value=80),
    back=st.integers(min_value=11, max_value=60),
    down=st.floats(min_value=1.0, max_value=100.0),
    redone=st.integers(min_value=1, max_value=120),
    explicit=st.booleans(),
)
def test_the_lost_steps_are_recovery_and_every_second_is_booked_once(
    crash, back, down, redone, explicit
):
    """Steps 0..crash-1, a crash, `down` seconds, then steps from checkpoint `crash - back`
    (or 0) on: the steps from the checkpoint to the crash are lost, whether or not they
    have been done again yet, and productive time counts each step number once."""
    resume = max(0, crash - back)
    before = steps(count=crash)
    after = steps(count=redone, first=resume, start=T0 + crash + down)
    events = [EventRow(T0 + crash + down / 2, "restart", "n0", run="r")] if explicit else []
    now = last_ts(after)
    g = goodput(run(before + after, events), now, timeline_after=last_ts(before))

    lost = crash - resume
    gap = down / 2 if explicit else down  # the restart → the resumed first step
    assert g.badput["recovery"] == pytest.approx(lost + gap)
    assert g.badput["idle"] == pytest.approx(down - gap, abs=1e-3)
    assert g.productive == pytest.approx((resume + redone) * 0.96)
    assert g.productive + sum(g.badput.values()) == pytest.approx(g.wall)
    assert g.wall == pytest.approx(now - T0)
