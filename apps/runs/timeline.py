"""A run's timeline, advanced by the step reports of one drain (runs_touch) and counted
once per restart whichever way it is known (a step counter going back, or supervise's
`restart` event).

A step counter that goes back (a report more than RESTART_STEPS below the run's highest,
newer than its newest) starts a new timeline: `timeline_after` becomes the old timeline's
newest report and `timeline_from` the new one's first. The reports are walked in time
order, one by one, because one drain may hold both timelines (the ranks of one node
reporting their last steps before the crash, another's their first after it): the highest
step of the drain as a whole was the old timeline's, so a restart went unseen until a
later drain, and then counted again.

Once a timeline began, a report older than its first (`timeline_from`) is the old
timeline's, arriving late (another node's last batch, a spool replayed): it no longer
raises `last_step`, which it did, so that the new timeline's next report was taken for a
second restart. The ranks of a job crash together and a restart takes seconds at least, so
no report of the new timeline is older than its first by more than clock skew.

Counting: `restarts` is what goodput's `restarts_of` sees over the run's whole life, each
restart once: every `restart` event, and every step-back that no event stands for. Supervise
sends its event as it starts the job again: after the old timeline's newest report, before
(or, across nodes' clocks, up to CLAIM_SLACK after) the new one's first. A step-back is that
event's restart when the event (`restart_event_at`, the newest counted) lies so; an event is
the step-back's restart when it lies so about the current timeline and no event had
claimed that timeline yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

# A report this many steps below the run's highest, newer than its newest, is a restart.
# Ranks of one synchronous job are within a step or two of each other.
RESTART_STEPS = 10
# How much later than the new timeline's first report a restart event may be stamped and
# still be that restart's (the supervisor's clock against the first reporting rank's).
CLAIM_SLACK = timedelta(seconds=60)


@dataclass(frozen=True)
class Timeline:
    """The columns of runs_run that the walk reads and writes."""

    first_step: int | None
    last_step: int | None
    last_step_at: datetime | None
    timeline_after: datetime | None
    timeline_from: datetime | None
    restarts: int
    restart_event_at: datetime | None


def timeline_advance(
    state: Timeline, reports: Iterable[tuple[datetime, int]], *, back: int = RESTART_STEPS
) -> Timeline:
    """`state` after the (time, step) `reports` of one drain (see the module docstring).
    Plain locals, not a dataclass a report: a drain holds thousands of reports."""
    first, last, last_at = state.first_step, state.last_step, state.last_step_at
    after, began, restarts, event = (
        state.timeline_after,
        state.timeline_from,
        state.restarts,
        state.restart_event_at,
    )
    for at, step in sorted(reports):
        first = step if first is None or step < first else first
        if began is not None and at < began:
            continue  # the old timeline's, late
        if last is None or last_at is None:
            last, last_at = step, at
        elif step < last - back and at > last_at:
            claimed = event is not None and last_at < event <= at + CLAIM_SLACK
            restarts += 0 if claimed else 1
            after, began, last, last_at = last_at, at, step, at
        else:
            last, last_at = max(last, step), max(last_at, at)
    return replace(
        state,
        first_step=first,
        last_step=last,
        last_step_at=last_at,
        timeline_after=after,
        timeline_from=began,
        restarts=restarts,
    )


def restart_event_counts(state: Timeline, at: datetime) -> bool:
    """Whether a `restart` event at `at` is a restart not counted yet: not the step-back of
    the current timeline, counted already with no event to claim it."""
    after, began, event = state.timeline_after, state.timeline_from, state.restart_event_at
    step_back_unclaimed = (
        after is not None
        and began is not None
        and after < at <= began + CLAIM_SLACK
        and (event is None or event <= after)
    )
    return not step_back_unclaimed
