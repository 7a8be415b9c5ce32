"""A resume is not a hang: a run whose step counter goes back (resumed from a checkpoint, or
resubmitted under its name) starts a new timeline. Its summary and the detectors' window
follow the newest steps, the restart is counted, and no hang is raised while it progresses;
a late batch from a spool, carrying its old times, is no restart."""

from __future__ import annotations

import time
import uuid

import pytest

from apps.alerts.selectors.window import cluster_window
from apps.ingest.models import InboxBatch
from apps.runs.models import Run
from detectors import hang
from launcher.procs import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def steps(run: str, numbers: range, *, end: float, step_s: float = 2.0) -> dict:
    """Steps `numbers` of ranks 0 and 1, the last at `end`, one every `step_s`."""
    last = numbers[-1]
    return {
        "batch_id": uuid.uuid4().hex,
        "node": "trainer-1",
        "run": run,
        "steps": [
            {"ts": end - (last - n) * step_s, "rank": rank, "step": n, "step_time": step_s}
            for n in numbers
            for rank in range(2)
        ],
    }


def stored(agent, *batches: dict) -> None:
    for batch in batches:
        assert agent.post(batch).status_code == 202
    wait_until(
        lambda: not InboxBatch.objects.filter(processed_at__isnull=True).exists(), 60, "storage"
    )


def test_steps_that_go_back_are_a_restart_not_a_hang(agent, agent_token):
    now = time.time()
    # steps 1..300 until 10 minutes ago, then 1..90 up to now (the reproduction)
    stored(agent, steps("rr", range(1, 301), end=now - 600))
    stored(agent, steps("rr", range(1, 91), end=now))
    run = Run.objects.get(cluster=agent_token[0].cluster, name="rr")
    assert (run.last_step, run.restarts) == (90, 1)
    assert run.timeline_after.timestamp() == pytest.approx(now - 600, abs=1e-3)
    summary = agent.get("/api/v1/runs/rr").json()
    assert (summary["last_step"], summary["restarts"]) == (90, 1)
    assert summary["timeline_after"] == pytest.approx(now - 600, abs=1e-3)

    window = cluster_window(cluster=agent_token[0].cluster, now=now + 1)
    [rr] = window.runs
    assert {row.step for row in rr.steps} <= set(range(1, 91))  # the old timeline is history
    assert max(row.step for row in rr.steps) == 90
    assert hang.detect(window, now + 1) == []
    # still a hang when the new timeline itself stops
    assert [f.kind for f in hang.detect(window, now + 600)] == ["hang"]


def test_a_late_batch_from_a_spool_is_no_restart(agent, agent_token):
    now = time.time()
    stored(agent, steps("rs", range(1, 301), end=now))
    stored(agent, steps("rs", range(100, 121), end=now - 400))  # old steps, their old times
    run = Run.objects.get(cluster=agent_token[0].cluster, name="rs")
    assert (run.last_step, run.restarts, run.timeline_after) == (300, 0, None)
    # and ranks a few steps apart are no restart either
    stored(agent, steps("rs", range(295, 299), end=now + 1))
    run.refresh_from_db()
    assert (run.last_step, run.restarts) == (300, 0)
