"""The evaluation harness end to end: simulators (with their noise model on) and
examples/ddp_train.py posting through the live stack, the replayed detectors, and the score.
(The computing straggler's DDP job has its own test: test_ddp_computing_straggler.py.)"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from apps.alerts.models import Alert
from apps.evaluation.services import evaluation_run, scenario_specs
from apps.evaluation.services.ddp import DDP_FAULTS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600), pytest.mark.stack]


def test_simulated_and_real_faults_are_found_and_named_and_a_clean_run_raises_nothing(
    live_stack, live_db, tmp_path
):
    # CI plays one noise level (10 % jitter, spikes on) and a 15-minute clean run, judged
    # every 5 s; `make evaluate` plays both levels and 2 clean hours per level.
    specs = scenario_specs(
        labels=["straggler", "sdc/param"], seeds=(2,), levels=(0.1,), clean_s=900, clean_step_s=5
    )
    results = evaluation_run(
        specs=specs, server=live_stack.url, workdir=tmp_path, ddp=(DDP_FAULTS,), log=lambda _: None
    )

    faults = {fault.label: fault for result in results for fault in result.score.faults}
    assert set(faults) == {
        "straggler",
        "sdc/param",
        "ddp straggler (sleeps 50 ms)",
        "ddp sdc/canary",
        "ddp sdc/param",
    }
    for label, fault in faults.items():
        assert fault.found and fault.culprit_right, label
        assert fault.time_to_detect is not None and fault.time_to_detect <= 30.01, label
    assert {r.spec.name: r.score.false_alarms for r in results} == {
        "straggler-s2-cv10": (),
        "sdc-param-s2-cv10": (),
        "clean-cv10": (),
        "ddp": (),
    }
    clean = next(r for r in results if r.spec.name == "clean-cv10")
    assert clean.scenario["noise"] == {"cv": 0.1, "spike_rate": 0.01}
    assert clean.evaluations == 180  # every 5 s of its 900 simulated seconds
    assert not Alert.objects.filter(cluster__name=clean.cluster).exists()


def test_two_faults_at_once_on_two_nodes_stay_two_incidents(live_stack, live_db, tmp_path):
    # A GPU of node 0 throttles while a rank of node 1 computes wrong gradients (canary).
    (spec,) = scenario_specs(labels=["thermal + sdc"], seeds=(1,), levels=(0.1,), clean_s=0)
    assert len(spec.faults) == 2
    (result,) = evaluation_run(
        specs=[spec], server=live_stack.url, workdir=tmp_path, log=lambda _: None
    )
    assert [(f.fault, f.found, f.culprit_right) for f in result.score.faults] == [
        ("thermal", True, True),
        ("sdc", True, True),
    ]
    assert result.score.false_alarms == ()
    folding = result.folding
    assert folding is not None and folding.false_folds == 0
    assert [(f.incidents, f.split, f.right) for f in folding.faults] == [(1, 0, True)] * 2
    # the heat's straggler folded under it: one incident holds both
    hot = Alert.objects.get(cluster__name=result.cluster, kind="thermal")
    slow = Alert.objects.filter(cluster__name=result.cluster, kind="straggler")
    assert slow.exists() and {a.incident_id for a in slow} == {hot.incident_id}
    wrong = Alert.objects.get(cluster__name=result.cluster, kind="sdc")
    assert wrong.incident_id not in (None, hot.incident_id)


def test_the_command_prints_the_table(live_stack, live_db, tmp_path):
    out = StringIO()
    call_command(
        "evaluate_detectors",
        *("--server", live_stack.url, "--fault", "xid", "--seeds", "1", "--clean", "0"),
        *("--noise", "0.3", "--no-ddp", "--workdir", str(tmp_path)),
        stdout=out,
        stderr=StringIO(),
    )
    printed = out.getvalue()
    assert "### Simulated faults, noise CV 30 %, spikes on: recall 1/1" in printed
    assert "| xid | 1 | 1/1 | 1/1 | 0 | 0 | 0 s | 0 s |" in printed
    # the XID's alerts fold into one incident rooted at the XID, nothing folded wrongly
    assert "#### Incidents, noise CV 30 %: one per fault" in printed
    assert "| xid | 1 | 1/1 | 0 | 0 |" in printed

    # The stored scenario judged again from scratch (as after a detector change): the same
    # table, and its alert was replaced, not added to.
    alerts = Alert.objects.filter(cluster__name__endswith="xid-s1-cv30")
    before = sorted(alerts.values_list("kind", "subject", "opened_at"))
    again = StringIO()
    call_command(
        "evaluate_detectors",
        *("--fault", "xid", "--seeds", "1", "--clean", "0", "--noise", "0.3", "--no-ddp"),
        *("--replay-from", str(tmp_path)),
        stdout=again,
        stderr=StringIO(),
    )
    assert again.getvalue() == printed
    assert before and sorted(alerts.values_list("kind", "subject", "opened_at")) == before
