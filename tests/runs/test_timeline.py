"""apps.runs.timeline: each restart counted once, however its reports and its event are
split across drains and whichever arrives first; a late report of the old timeline raises
nothing. (Pure: no database.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from apps.runs.timeline import Timeline, restart_event_counts, timeline_advance

T0 = datetime(2026, 12, 7, tzinfo=UTC)
NEW = Timeline(None, None, None, None, None, 0, None)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reports(node_steps: range, start: float, step_s: float = 1.0) -> list[tuple[datetime, int]]:
    """One report a step, the first at `start` seconds."""
    return [(at(start + i * step_s), n) for i, n in enumerate(node_steps)]


# Two nodes ran steps 1..150 (one a second); both crashed; the job restarted from step 100
# 30 s later. Node A's reports: old then new; node B's the same, stamped 0.2 s later.
OLD_A, OLD_B = reports(range(1, 151), 0), reports(range(1, 151), 0.2)
NEW_A, NEW_B = reports(range(101, 121), 180), reports(range(101, 121), 180.2)


def event(state: Timeline, seconds: float) -> Timeline:
    """State after a `restart` event at `seconds` (as services.runs_end applies it)."""
    stamp = at(seconds)
    counted = restart_event_counts(state, stamp)
    newest = max(filter(None, (state.restart_event_at, stamp)))
    return Timeline(
        state.first_step,
        state.last_step,
        state.last_step_at,
        state.timeline_after,
        state.timeline_from,
        state.restarts + counted,
        newest,
    )


def test_one_node_restarting_before_the_others_late_batch_is_one_restart():
    # drains: A's old, A's new, B's old (late), B's new: B's late old steps raised
    # last_step back to 150 before, and its new ones then counted a second restart
    state = NEW
    for drain in (OLD_A, NEW_A, OLD_B, NEW_B):
        state = timeline_advance(state, drain)
    assert (state.restarts, state.last_step) == (1, 120)
    assert state.timeline_after == at(149) and state.timeline_from == at(180)


def test_a_drain_holding_both_timelines_counts_its_restart_there():
    state = timeline_advance(NEW, OLD_A[:100])
    state = timeline_advance(state, OLD_A[100:] + OLD_B + NEW_A + NEW_B)
    assert (state.restarts, state.last_step, state.timeline_from) == (1, 120, at(180))


def test_the_event_and_the_step_back_are_one_restart_whichever_comes_first():
    stepped = timeline_advance(timeline_advance(NEW, OLD_A + OLD_B), NEW_A + NEW_B)
    assert event(stepped, 175).restarts == 1  # the event after the step-back
    evented = event(timeline_advance(NEW, OLD_A + OLD_B), 175)
    assert evented.restarts == 1
    assert timeline_advance(evented, NEW_A + NEW_B).restarts == 1  # the step-back after it


def test_a_restart_too_short_to_step_back_counts_by_its_event():
    # crashed 5 steps past the checkpoint: the counter goes back less than RESTART_STEPS
    state = timeline_advance(NEW, reports(range(1, 106), 0))
    state = event(state, 130)
    state = timeline_advance(state, reports(range(101, 130), 140))
    assert (state.restarts, state.timeline_after, state.last_step) == (1, None, 129)


def test_two_restarts_are_two_and_a_spool_replay_raises_nothing():
    state = timeline_advance(NEW, OLD_A)
    state = timeline_advance(event(state, 175), NEW_A)
    second = reports(range(111, 131), 300)  # crashed again at 120, restarted from 110
    state = timeline_advance(event(state, 290), second)
    assert state.restarts == 2
    replayed = timeline_advance(state, OLD_A[120:])  # the first timeline, its own times
    assert replayed == state


def test_without_an_event_a_step_back_is_a_restart_and_ranks_apart_are_not():
    state = timeline_advance(NEW, OLD_A)
    assert timeline_advance(state, [(at(151), 141)]).restarts == 0  # 9 below: jitter
    assert timeline_advance(state, NEW_A).restarts == 1


@settings(max_examples=80, deadline=None)
@given(st.integers(120, 149), st.permutations(range(3)), st.integers(0, 3))
def test_any_arrival_of_the_crashs_last_reports_and_the_event_is_one_restart(
    seen, order, event_slot
):
    # node A's steps up to `seen` have arrived; the rest (A's and B's last steps before the
    # crash, each node's first after the restart) and the event arrive in any order
    rest = [OLD_A[seen:] + OLD_B, NEW_A, NEW_B]
    state = timeline_advance(NEW, OLD_A[:seen])
    for slot, index in enumerate(order):
        if slot == event_slot:
            state = event(state, 175)
        state = timeline_advance(state, rest[index])
    if event_slot == len(order):
        state = event(state, 175)
    assert (state.restarts, state.last_step) == (1, 120)
    assert state.timeline_after is not None and state.timeline_after <= at(149.2)
    assert state.timeline_from in (at(180), at(180.2))
