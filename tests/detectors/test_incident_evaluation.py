"""detectors.incident_evaluation: one incident per fault with the right root; no false folds."""

from __future__ import annotations

from detectors.evaluation import AlertRecord
from detectors.incident_evaluation import (
    IncidentRecord,
    format_folding,
    score_folding,
    summarize_folding,
)

T0 = 1_764_470_000.0
THERMAL = {"fault": "thermal", "start_ts": T0, "subject": {"node": "node-02", "gpu": 3}}
SDC = {
    "fault": "sdc",
    "start_ts": T0,
    "subject": {"run": "run-1", "rank": 40, "node": "node-07"},
    "params": {"mode": "param"},
}


def hot(at: float = T0 + 40) -> AlertRecord:
    return AlertRecord("thermal", "node:node-02/gpu:3", at, "run-1", "node-02", None, 3)


def slow() -> AlertRecord:
    return AlertRecord("straggler", "run:run-1/rank:3", T0 + 30, "run-1", "node-02", 3, 3)


def corrupt() -> AlertRecord:
    evidence = {"cause": "parameter checksum"}
    return AlertRecord("sdc", "run:run-1/rank:40", T0 + 50, "run-1", "node-07", 40, None, evidence)


def rooted(kind: str, *alerts: AlertRecord, node=None, gpu=None, rank=None) -> IncidentRecord:
    return IncidentRecord(alerts[0].opened_at, kind, alerts, node, gpu, rank, run="run-1")


def test_a_thermal_fault_folded_with_its_straggler_under_the_heat_is_right():
    incident = rooted("thermal", slow(), hot(), node="node-02", gpu=3)
    score = score_folding({"faults": [THERMAL]}, [incident])
    assert [(f.label, f.incidents, f.right) for f in score.faults] == [("thermal", 1, True)]
    assert score.false_folds == 0


def test_the_heats_straggler_opened_as_its_own_incident_splits_the_fault():
    score = score_folding(
        {"faults": [THERMAL]},
        [rooted("thermal", hot(), node="node-02", gpu=3),
         rooted("straggler", slow(), node="node-02", gpu=3, rank=3)],
    )  # fmt: skip
    assert [(f.incidents, f.split, f.right) for f in score.faults] == [(1, 1, False)]
    assert "| thermal | 1 | 0/1 | 0 | 1 |" in format_folding(summarize_folding([score]))


def test_a_straggler_on_another_gpu_is_no_split_of_the_heat():
    elsewhere = AlertRecord("straggler", "run:run-1/rank:9", T0 + 30, "run-1", "node-03", 9, 1)
    score = score_folding(
        {"faults": [THERMAL]},
        [rooted("thermal", hot(), node="node-02", gpu=3),
         rooted("straggler", elsewhere, node="node-03", gpu=1, rank=9)],
    )  # fmt: skip
    assert [(f.split, f.right) for f in score.faults] == [(0, True)]


def test_two_thermal_incidents_for_one_heat_are_two_not_one():
    score = score_folding(
        {"faults": [THERMAL]},
        [rooted("thermal", hot(), node="node-02", gpu=3), rooted("thermal", hot(T0 + 90),
                                                                 node="node-02", gpu=3)],
    )  # fmt: skip
    assert score.faults[0].right is False and score.faults[0].incidents == 2


def test_two_faults_folded_into_one_incident_is_a_false_fold():
    from detectors.sdc import CAUSES

    evidence = {"cause": CAUSES["param_checksum"]}
    sdc = AlertRecord("sdc", "run:run-1/rank:40", T0 + 50, "run-1", "node-07", 40, None, evidence)
    both = rooted("thermal", hot(), sdc, node="node-02", gpu=3)
    score = score_folding({"faults": [THERMAL, SDC]}, [both])
    assert score.false_folds == 1
    assert [f.right for f in score.faults] == [True, False]  # the SDC has no incident of its own
    apart = [rooted("thermal", hot(), node="node-02", gpu=3),
             rooted("sdc", sdc, node="node-07", rank=40)]  # fmt: skip
    score = score_folding({"faults": [THERMAL, SDC]}, apart)
    assert score.false_folds == 0 and all(f.right for f in score.faults)


def test_on_a_clean_run_any_folded_pair_is_a_false_fold_and_the_table_says_so():
    clean = score_folding({"faults": []}, [rooted("thermal", hot(), slow())])
    right = score_folding({"faults": [THERMAL]}, [rooted("thermal", hot(), node="node-02", gpu=3)])
    assert clean.false_folds == 1
    table = format_folding(summarize_folding([right, clean]))
    assert "| thermal | 1 | 1/1 | 0 | 0 |" in table
    assert "| clean | 1 | — | 1 | 0 |" in table
