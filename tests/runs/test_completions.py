"""Goodput reads stored step completions (apps.runs.completions), and says exactly what the
raw reports say: before the refresh (every step marked, read raw), after it (read stored),
after a restart event that arrived late (the rows it splits read raw), after a late report
(its step read raw until the next refresh), and through a refresh run twice."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from django.db import connection

from apps.clusters.models import Cluster, Node
from apps.runs.completions import completions_refresh
from apps.runs.models import Run, RunEvent
from apps.runs.retention import run_events_prune
from apps.runs.selectors import run_goodput, run_summary
from apps.runs.services import steps_store
from detectors.goodput import completions
from detectors.types import RunWindow, StepRow

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0
RANKS = 12


@pytest.fixture
def node() -> Node:
    return Node.objects.create(cluster=Cluster.objects.create(name="c"), name="n0")


def rows_of(run: Run, node: Node, numbers: range, start: float, seed: int) -> list[tuple]:
    """Steps `numbers` of RANKS jittered ranks, one about every 1.1 s from `start`: each rank's
    times differ, so every median is a real median."""
    rng = random.Random(seed)
    out = []
    for index, number in enumerate(numbers):
        for rank in range(RANKS):
            step_time = 1.0 + rng.uniform(-0.2, 0.3)
            out.append(
                (run.id, node.id, {
                    "ts": round(start + 1.1 * index + rng.uniform(0, 0.05), 6), "rank": rank,
                    "step": number, "step_time": step_time, "data_time": rng.uniform(0, 0.2),
                    "h2d_time": 0.01 if rank % 2 else None, "tokens": 1000,
                })
            )  # fmt: skip
    return out


def put(run: Run, rows: list[tuple]) -> None:
    """Store as ingest does, a batch per step (each batch marks its steps), and keep the run's
    step fields as ingest would."""
    by_step: dict[int, list[tuple]] = {}
    for row in rows:
        by_step.setdefault(row[2]["step"], []).append(row)
    for batch in by_step.values():
        steps_store(steps=batch)
    last = rows[-1][2]
    run.last_step, run.last_step_at = last["step"], datetime.fromtimestamp(last["ts"], UTC)
    run.world_size = RANKS
    run.save(update_fields=["last_step", "last_step_at", "world_size"])


def run_started(node: Node, name: str) -> Run:
    run = Run.objects.create(cluster=node.cluster, name=name)
    Run.objects.filter(pk=run.pk).update(created_at=datetime.fromtimestamp(T0 - 5, UTC))
    run.refresh_from_db()
    return run


def counts() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM runs_completiondirty),"
            " (SELECT count(*) FROM runs_stepcompletion)"
        )
        return cursor.fetchone()


def all_marked(run: Run) -> None:
    """Mark every step of the run: the next read is all raw (the oracle)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_completiondirty (run_id, s0, s1) VALUES (%s, 0, 1000000)", [run.id]
        )


def test_stored_completions_give_the_raw_reports_goodput(node):
    run = run_started(node, "r")
    rows = rows_of(run, node, range(1, 81), T0, seed=1)
    put(run, rows)
    now = T0 + 100
    raw = run_goodput(run=run, now=now)
    assert counts() == (80, 0)  # every step marked, nothing stored: read raw

    assert completions_refresh() == 80
    assert counts() == (0, 80)
    assert run_goodput(run=run, now=now) == raw
    assert raw["goodput"] > 0.5

    # and the stored medians are the pure function's (detectors.goodput.completions)
    window = RunWindow(
        run="r", world_size=RANKS, started_at=T0, events=(),
        steps=tuple(StepRow(ts=s["ts"], node="n0", rank=s["rank"], step=s["step"],
                            step_time=s["step_time"], data_time=s["data_time"],
                            h2d_time=s.get("h2d_time")) for *_, s in rows),
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT step, end_ts, step_time, data FROM runs_stepcompletion ORDER BY step"
        )
        stored = cursor.fetchall()
    pure = [(c.step, c.end, c.step_time, c.data) for c in completions(window, [])]
    assert [row[0] for row in stored] == [row[0] for row in pure]
    for got, want in zip(stored, pure, strict=True):
        assert got == pytest.approx(want, abs=2e-6)  # the stored microseconds


def test_a_late_report_reads_its_step_raw_until_the_refresh(node, django_assert_num_queries):
    run = run_started(node, "late")
    put(run, rows_of(run, node, range(1, 61), T0, seed=2))
    completions_refresh()
    now = T0 + 80
    before = run_goodput(run=run, now=now)
    # a straggler's report of step 30, very late: it moves that step's medians
    steps_store(steps=[(run.id, node.id, {"ts": T0 + 40, "rank": RANKS, "step": 30,
                                          "step_time": 9.0, "data_time": 5.0})])  # fmt: skip
    assert counts()[0] == 1
    # the recent events, the newest checkpoints, the completions: marked steps read raw in it
    with django_assert_num_queries(3):
        late = run_goodput(run=run, now=now)
    assert late != before
    completions_refresh()
    assert counts() == (0, 60)
    assert run_goodput(run=run, now=now) == late
    all_marked(run)
    assert run_goodput(run=run, now=now) == late


def test_a_replayed_timeline_and_a_late_restart_event_read_as_raw(node):
    run = run_started(node, "replay")
    put(run, rows_of(run, node, range(1, 41), T0, seed=3))
    # resumed from step 20, 30 s after the old timeline's last step
    restart_at = T0 + 1.1 * 40 + 10
    put(run, rows_of(run, node, range(20, 51), restart_at + 20, seed=4))
    completions_refresh()
    now = restart_at + 20 + 1.1 * 31 + 5
    assert counts()[1] == 50  # no restart known yet: one row a step, 20..40 mixing timelines

    # the restart event arrives now: the mixed rows straddle it, and are read raw
    RunEvent.objects.create(
        cluster=node.cluster, node=node, run=run, kind="restart",
        ts=datetime.fromtimestamp(restart_at, UTC), data={},
    )  # fmt: skip
    late = run_goodput(run=run, now=now)
    all_marked(run)
    oracle = run_goodput(run=run, now=now)
    assert late == oracle
    assert oracle["badput_s"]["recovery"] > 20  # the lost steps 20..40 and the gap

    # a refresh after the event (the marks above) splits them: two rows for each replayed
    # step, and the same answer
    completions_refresh()
    assert counts() == (0, 50 + 21)
    assert run_goodput(run=run, now=now) == oracle


def test_a_refresh_run_twice_stores_each_completion_once(node):
    run = run_started(node, "twice")
    put(run, rows_of(run, node, range(1, 31), T0, seed=5))
    completions_refresh()
    all_marked(run)
    all_marked(run)
    assert completions_refresh() == 2
    assert counts() == (0, 30)
    assert completions_refresh() == 0


def test_pure_goodput_matches_with_events(node):
    """A run with a local checkpoint save: the stored read and the pure function agree."""
    run = run_started(node, "ck")
    rows = rows_of(run, node, range(1, 41), T0, seed=6)
    put(run, rows)
    RunEvent.objects.create(
        cluster=node.cluster, node=node, run=run, kind="checkpoint", step=20,
        ts=datetime.fromtimestamp(T0 + 23, UTC),
        data={"tier": "local", "state": "completed", "duration": 1.5},
    )  # fmt: skip
    completions_refresh()
    now = T0 + 50
    got = run_goodput(run=run, now=now)
    assert got["badput_s"]["checkpoint"] > 0
    all_marked(run)
    assert run_goodput(run=run, now=now) == got


def test_tokens_a_second_come_from_the_completions_of_the_last_minute(node):
    run = run_started(node, "tok")
    put(run, rows_of(run, node, range(1, 101), T0, seed=7))
    now = T0 + 120
    raw = run_summary(run=run, now=now)
    # 12 ranks × 1,000 tokens a step, a step every 1.1 s (each step's median end jitters)
    assert raw["tokens_per_s"] == pytest.approx(RANKS * 1000 / 1.1, rel=0.01)
    completions_refresh()
    assert run_summary(run=run, now=now) == raw


def test_completions_are_kept_as_long_as_the_raw_reports(node, settings):
    settings.HISTORY_RAW_RETENTION_DAYS = 7
    run = run_started(node, "old")
    put(run, rows_of(run, node, range(1, 31), T0, seed=8))
    completions_refresh()
    day = 86400
    assert run_events_prune(now=datetime.fromtimestamp(T0 + 6 * day, UTC)).completions == 0
    assert counts() == (0, 30)
    assert run_events_prune(now=datetime.fromtimestamp(T0 + 8 * day, UTC)).completions == 30
    assert counts() == (0, 0)
