"""Checkpoints: work at risk since the last durable one, and uploads that failed."""

from __future__ import annotations

import pytest

from detectors import checkpoint
from detectors.types import EventRow
from tests.detectors.builders import T0, cluster, run, steps

ROWS = steps(count=10)


def ckpt(ts, step, tier, state):
    return EventRow(
        T0 + ts,
        "checkpoint",
        "n0",
        run="r",
        step=step,
        data={"tier": tier, "state": state, "path": f"/x/{step}"},
    )


def findings(events, now, kind=None, started_at=T0):
    found = checkpoint.detect(cluster(run(ROWS, events, started_at=started_at)), T0 + now)
    return [f for f in found if kind is None or f.kind == kind]


@pytest.mark.parametrize(("age_min", "expected"), [(59, 0), (61, 1)])
def test_it_alerts_when_the_durable_checkpoint_is_too_old(age_min, expected):
    events = [ckpt(100, 5, "durable", "completed")]
    assert len(findings(events, 100 + age_min * 60, "checkpoint_stale")) == expected


def test_it_counts_work_at_risk_from_the_durable_checkpoint():
    (f,) = findings(
        [ckpt(100, 5, "local", "completed"), ckpt(200, 5, "durable", "completed")],
        200 + 7200,
        "checkpoint_stale",
    )
    assert f.subject == "run:r" and f.severity == "critical"  # twice the limit
    assert f.evidence["work_at_risk_gpu_hours"] == pytest.approx(16 * 2, rel=1e-3)
    assert f.evidence["durable_step"] == 5 and f.evidence["steps_since"] == 4
    assert "32.0 GPU-hours" in f.summary


def test_without_a_durable_checkpoint_it_counts_from_the_run_start():
    (f,) = findings([ckpt(100, 5, "local", "completed")], 3700, "checkpoint_stale")
    assert "since the run started" in f.summary and f.evidence["durable_step"] is None
    assert findings([], 3500, "checkpoint_stale") == []


def test_a_failed_upload_alerts_at_once():
    events = [
        ckpt(100, 5, "local", "completed"),
        ckpt(101, 5, "durable", "started"),
        ckpt(160, 5, "durable", "failed"),
    ]
    (f,) = findings(events, 161, "checkpoint_upload")
    assert f.severity == "critical" and f.evidence["state"] == "failed" and "step-5" in f.summary


@pytest.mark.parametrize(("wait_min", "expected"), [(9, 0), (11, 1)])
def test_an_upload_that_does_not_complete_alerts_after_the_limit(wait_min, expected):
    events = [ckpt(100, 5, "local", "completed"), ckpt(101, 5, "durable", "started")]
    assert len(findings(events, 100 + wait_min * 60, "checkpoint_upload")) == expected


def test_a_newer_durable_checkpoint_clears_an_old_failure():
    events = [
        ckpt(100, 5, "local", "completed"),
        ckpt(160, 5, "durable", "failed"),
        ckpt(300, 8, "local", "completed"),
        ckpt(320, 8, "durable", "completed"),
    ]
    assert findings(events, 400, "checkpoint_upload") == []


def test_checkpoint_status_gives_the_run_summary():
    events = [ckpt(100, 5, "local", "completed"), ckpt(130, 5, "durable", "completed")]
    status = checkpoint.checkpoint_status(run(ROWS, events), T0 + 130 + 1800)
    assert status["local"] == {"step": 5, "at": T0 + 100}
    assert status["durable"] == {"step": 5, "at": T0 + 130}
    assert status["work_at_risk_gpu_hours"] == pytest.approx(8.0)
