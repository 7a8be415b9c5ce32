"""Hang: the step counter stopped while the nodes still report."""

from __future__ import annotations

import pytest

from detectors import hang
from detectors.types import EventRow, NodeSeen
from tests.detectors.builders import cluster, last_ts, run, steps

ROWS = steps(count=30)  # 1.0 s steps: the limit is max(10 s, 120 s) = 120 s
LAST = last_ts(ROWS)


def findings(now, events=(), nodes=None):
    nodes = nodes if nodes is not None else [NodeSeen(n, now - 5, 10) for n in ("n0", "n1")]
    return hang.detect(cluster(run(ROWS, events), nodes=nodes), now)


@pytest.mark.parametrize(("stalled", "expected"), [(119, 0), (121, 1)])
def test_it_reports_a_stall_past_the_limit(stalled, expected):
    assert len(findings(LAST + stalled)) == expected


def test_the_limit_grows_with_slow_steps():
    rows = steps(count=30, compute=lambda r, s: 19.8)  # 20 s steps: limit 200 s
    window = cluster(run(rows), nodes=[NodeSeen("n0", last_ts(rows) + 190, 10)])
    assert hang.detect(window, last_ts(rows) + 195) == []
    (f,) = hang.detect(window, last_ts(rows) + 205)
    assert f.evidence["limit_s"] == pytest.approx(200, rel=1e-3)


def test_it_names_the_run_its_last_step_and_the_cost():
    (f,) = findings(LAST + 300)
    assert f.kind == "hang" and f.subject == "run:r" and f.severity == "critical"
    assert f.evidence["last_step"] == 29 and f.evidence["stalled_s"] == pytest.approx(300)
    assert f.evidence["gpu_hours_idle"] == pytest.approx(16 * 300 / 3600, rel=1e-3)
    assert "since step 29" in f.summary


def test_it_leaves_a_run_whose_nodes_are_all_silent_to_the_heartbeat():
    assert findings(LAST + 300, nodes=[NodeSeen(n, LAST, 10) for n in ("n0", "n1")]) == []


def test_it_names_a_silent_node():
    now = LAST + 300
    (f,) = findings(now, nodes=[NodeSeen("n0", now - 5, 10), NodeSeen("n1", LAST, 10)])
    assert f.evidence["silent_nodes"] == ["n1"] and "n1 went silent" in f.summary


def ckpt(ts: float, state: str, step: int = 29, tier: str = "local") -> EventRow:
    return EventRow(ts, "checkpoint", "n0", run="r", step=step, data={"tier": tier, "state": state})


def test_a_checkpoint_in_progress_excuses_the_stall_until_its_timeout():
    started = ckpt(LAST + 1, "started")
    assert findings(LAST + 600, [started]) == []
    (f,) = findings(LAST + 1 + 1801, [started])
    assert f.evidence["checkpoint_step"] == 29


def test_a_finished_or_background_checkpoint_excuses_nothing():
    done = [ckpt(LAST + 1, "started"), ckpt(LAST + 5, "completed")]
    assert len(findings(LAST + 300, done)) == 1
    upload = [ckpt(LAST - 20, "started", step=20, tier="durable")]
    assert len(findings(LAST + 300, upload)) == 1
