"""The evaluation harness end to end: simulators and examples/ddp_train.py posting through
the live stack, the replayed detectors, and the score."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from apps.alerts.models import Alert
from apps.evaluation.services import evaluation_run, scenario_specs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600), pytest.mark.stack]


def test_simulated_and_real_faults_are_found_and_named_and_a_clean_run_raises_nothing(
    live_stack, live_db, tmp_path
):
    specs = scenario_specs(labels=["straggler", "sdc/param"], seeds=(2,), clean_s=900)
    results = evaluation_run(
        specs=specs, server=live_stack.url, workdir=tmp_path, ddp=True, log=lambda _: None
    )

    faults = {fault.label: fault for result in results for fault in result.score.faults}
    assert set(faults) == {
        "straggler",
        "sdc/param",
        "ddp straggler",
        "ddp sdc/canary",
        "ddp sdc/param",
    }
    for label, fault in faults.items():
        assert fault.found and fault.culprit_right, label
        assert fault.time_to_detect is not None and fault.time_to_detect <= 30.01, label
    assert {r.spec.name: r.score.false_alarms for r in results} == {
        "straggler-s2": (),
        "sdc-param-s2": (),
        "clean": (),
        "ddp": (),
    }
    clean = next(r for r in results if r.spec.name == "clean")
    assert clean.evaluations == 180  # every 5 s of its 900 simulated seconds
    assert not Alert.objects.filter(cluster__name=clean.cluster).exists()


def test_the_command_prints_the_table(live_stack, live_db, tmp_path):
    out = StringIO()
    call_command(
        "evaluate_detectors",
        *("--server", live_stack.url, "--fault", "xid", "--seeds", "1", "--clean", "0"),
        *("--no-ddp", "--workdir", str(tmp_path)),
        stdout=out,
        stderr=StringIO(),
    )
    assert "| xid | 1 | 1/1 | 1/1 | 0 | 0 | 0 s | 0 s |" in out.getvalue()
