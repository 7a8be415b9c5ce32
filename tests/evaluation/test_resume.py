"""`make evaluate`'s resume: a simulated job crashes and resumes from its checkpoint, so its
step counter goes back (seed 1 with supervise's `restart` event, seed 2 without). Played
through the live stack and replayed: no hang while it steps on, the restart counted, the
lost steps booked as recovery."""

from __future__ import annotations

import time

import pytest

from apps.alerts.models import Alert
from apps.evaluation.services import evaluation_run, scenario_specs
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import run_goodput

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300), pytest.mark.stack]


def test_a_resume_is_a_restart_with_its_lost_steps_booked_and_no_hang(
    live_stack, live_db, tmp_path
):
    # twice `make evaluate`'s speed and half its replay rate: the test stays near a minute
    specs = scenario_specs(
        labels=["resume"], seeds=(1, 2), levels=(0.1,), clean_s=0, speed=40.0, step_s=10.0
    )
    started = time.monotonic()
    results = evaluation_run(
        specs=specs,
        server=live_stack.url,
        workdir=tmp_path,
        ddp=(),
        log=lambda line: print(f"{time.monotonic() - started:.1f} s {line}"),
    )

    assert [r.spec.name for r in results] == ["resume-s1-cv10", "resume-s2-cv10"]
    for result in results:
        (fault,) = result.score.faults
        assert fault.label == "resume" and fault.found and fault.culprit_right, result.spec.name
        assert result.score.false_alarms == () and result.score.consequences == ()
        assert not Alert.objects.filter(cluster__name=result.cluster).exists()
        (injected,) = result.scenario["faults"]
        # the counter goes back further than a late batch or a lagging rank could
        assert injected["checkpoint_step"] == 100 and injected["crash_step"] > 100 + 10
        # played on past the 120 s after the crash that a hang takes: had the old
        # timeline's last step stood as the run's, the replay would have raised one
        assert result.scenario["end_ts"] - injected["start_ts"] > 120 + 10
        (run,) = Run.objects.filter(cluster__name=result.cluster)
        assert run.restarts == 1 and run.last_step > injected["resume_step"]
        goodput = run_goodput(run=run, now=result.scenario["end_ts"])
        assert goodput["badput_s"]["recovery"] >= 0.9 * injected["lost_s"] > 40
    sent = RunEvent.objects.filter(
        kind="restart", run__cluster__name__in=[r.cluster for r in results]
    )
    # seed 1 sends supervise's event, seed 2 leaves the restart to be inferred
    assert [e.run.cluster.name for e in sent] == [results[0].cluster]
