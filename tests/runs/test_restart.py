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


def node_steps(run: str, node: str, ranks: range, numbers: range, *, start: float) -> dict:
    """Steps `numbers` of `ranks` on `node`, one a second from `start`."""
    return {
        "batch_id": uuid.uuid4().hex,
        "node": node,
        "run": run,
        "steps": [
            {"ts": start + i, "rank": rank, "step": n, "step_time": 1.0}
            for i, n in enumerate(numbers)
            for rank in ranks
        ],
    }


def interruptions(agent, run: str) -> int:
    return len(agent.get(f"/api/v1/runs/{run}/report").json()["interruptions"])


def test_a_nodes_late_last_steps_make_no_second_restart(agent, agent_token):
    # both nodes crash at step 150 and resume from 100 30 s later; node 2's last steps
    # before the crash arrive after node 1's first after it (they once raised last_step to
    # 150 again, and node 2's first new steps then counted a second restart)
    t0 = time.time() - 400
    old, new = range(1, 151), range(101, 121)
    stored(agent, node_steps("rl", "trainer-1", range(0, 2), old, start=t0))
    stored(agent, node_steps("rl", "trainer-1", range(0, 2), new, start=t0 + 180))
    stored(agent, node_steps("rl", "trainer-2", range(2, 4), old, start=t0 + 0.2))
    stored(agent, node_steps("rl", "trainer-2", range(2, 4), new, start=t0 + 180.2))
    summary = agent.get("/api/v1/runs/rl").json()
    assert (summary["restarts"], summary["last_step"]) == (1, 120)
    assert interruptions(agent, "rl") == 1  # the report counts the restart as the run does


def test_a_restart_event_counts_though_the_counter_barely_went_back(agent, agent_token):
    # crashed 5 steps past its checkpoint: fewer than RESTART_STEPS back, so only
    # supervise's event says it restarted; the summary counted 0 while goodput booked it
    t0 = time.time() - 400
    stored(agent, node_steps("re", "trainer-1", range(0, 2), range(1, 106), start=t0))
    restart = {"ts": t0 + 130, "kind": "restart", "rank": 0, "restart_count": 1}
    stored(agent, {"batch_id": uuid.uuid4().hex, "node": "trainer-1", "run": "re",
                   "events": [restart]})  # fmt: skip
    stored(agent, node_steps("re", "trainer-1", range(0, 2), range(101, 131), start=t0 + 140))
    summary = agent.get("/api/v1/runs/re").json()
    assert summary["restarts"] == 1 == interruptions(agent, "re")
    assert summary["goodput"]["badput_s"]["recovery"] > 0
