"""Scoring alerts against injected faults (pure: no database)."""

from __future__ import annotations

from detectors.evaluation import (
    AlertRecord,
    RunRecord,
    format_sensitivity,
    format_table,
    score_scenario,
    summarize,
)

BASE = 1_800_000_000.0
STRAGGLER = {
    "fault": "straggler",
    "subject": {"run": "r", "node": "n1", "rank": 13, "gpu": 5},
    "start_ts": BASE + 60,
    "params": {"factor": 1.35},
}


def alert(kind: str, at: float, **fields) -> AlertRecord:
    subject = "/".join(f"{key}:{value}" for key, value in fields.items())
    return AlertRecord(kind=kind, subject=subject, opened_at=BASE + at, **fields)


def scenario(*faults: dict) -> dict:
    return {"base_ts": BASE, "end_ts": BASE + 300, "faults": list(faults)}


def test_the_first_alert_naming_the_culprit_finds_the_fault():
    score = score_scenario(scenario(STRAGGLER), [alert("straggler", 95, run="r", rank=13)])
    (fault,) = score.faults
    assert fault.found and fault.culprit_right and fault.time_to_detect == 35
    assert score.false_alarms == ()


def test_an_alert_naming_another_rank_is_a_false_alarm_and_a_wrong_culprit():
    score = score_scenario(scenario(STRAGGLER), [alert("straggler", 90, run="r", rank=12)])
    (fault,) = score.faults
    assert not fault.found and not fault.culprit_right
    assert [a.rank for a in score.false_alarms] == [12]


def test_an_alert_before_the_fault_began_is_a_false_alarm():
    score = score_scenario(
        scenario(STRAGGLER),
        [alert("straggler", 30, run="r", rank=13), alert("straggler", 100, run="r", rank=13)],
    )
    assert score.faults[0].time_to_detect == 40
    assert [a.opened_at - BASE for a in score.false_alarms] == [30]


def test_what_follows_from_a_fault_is_a_consequence_not_a_false_alarm():
    thermal = {**STRAGGLER, "fault": "thermal", "params": {"temp": 92}}
    score = score_scenario(
        scenario(thermal),
        [alert("thermal", 120, node="n1", gpu=5), alert("straggler", 150, run="r", rank=13)],
    )
    assert score.faults[0].found and score.false_alarms == ()
    assert [a.kind for a in score.consequences] == ["straggler"]


def test_an_sdc_alert_must_carry_the_evidence_of_its_mode():
    flipped = {**STRAGGLER, "fault": "sdc", "params": {"mode": "param"}}
    wrong = AlertRecord(
        "sdc",
        "run:r/rank:13",
        BASE + 70,
        run="r",
        rank=13,
        evidence={"cause": "the GPU computes wrong gradients"},
    )
    right = AlertRecord(
        "sdc",
        "run:r/rank:13",
        BASE + 70,
        run="r",
        rank=13,
        evidence={"cause": "the replica's weights were corrupted"},
    )
    assert not score_scenario(scenario(flipped), [wrong]).faults[0].found
    assert score_scenario(scenario(flipped), [right]).faults[0].found


def test_a_clean_run_counts_every_alert_as_a_false_alarm_in_the_table():
    clean = score_scenario(scenario(), [alert("hang", 200, run="r")])
    found = score_scenario(scenario(STRAGGLER), [alert("straggler", 80, run="r", rank=13)])
    table = format_table(summarize([found, clean]))
    assert "| straggler | 1 | 1/1 | 1/1 | 0 | 0 | 20 s | 20 s |" in table
    assert "| clean | 1 | — | — | 1 |" in table


def test_an_alert_that_finds_another_fault_does_not_make_a_culprit_wrong():
    canary = {
        **STRAGGLER,
        "fault": "sdc",
        "subject": {"run": "r", "rank": 1},
        "params": {"mode": "canary"},
    }
    flip = {
        **STRAGGLER,
        "fault": "sdc",
        "subject": {"run": "r", "rank": 2},
        "params": {"mode": "param"},
    }
    alerts = [
        AlertRecord(
            "sdc",
            "run:r/rank:1",
            BASE + 61,
            run="r",
            rank=1,
            evidence={"cause": "the GPU computes wrong gradients"},
        ),
        AlertRecord(
            "sdc",
            "run:r/rank:2",
            BASE + 62,
            run="r",
            rank=2,
            evidence={"cause": "the replica's weights were corrupted"},
        ),
    ]
    score = score_scenario(scenario(canary, flip), alerts)
    assert [(f.found, f.culprit_right) for f in score.faults] == [(True, True), (True, True)]
    assert score.false_alarms == ()


def test_the_sensitivity_table_shows_each_strength_found_or_not_per_noise_level():
    def straggler(factor: str, found_at: float | None):
        fault = {**STRAGGLER, "label": f"{factor}x straggler"}
        alerts = [] if found_at is None else [alert("straggler", found_at, run="r", rank=13)]
        return score_scenario(scenario(fault), alerts)

    quiet = summarize([straggler("2", 80), straggler("1.2", 90), straggler("1.5", 85)])
    noisy = summarize([straggler("2", 85), straggler("1.2", None), straggler("1.5", 100)])
    table = format_sensitivity({"CV 10 %": quiet, "CV 30 %": noisy})
    lines = table.splitlines()
    assert lines[0] == (
        "| fault | CV 10 %: found | TTD median | TTD max | CV 30 %: found | TTD median | TTD max |"
    )
    # weakest first; a miss reads 0/1 with no time
    assert lines[2:] == [
        "| 1.2x straggler | 1/1 | 30 s | 30 s | 0/1 | — | — |",
        "| 1.5x straggler | 1/1 | 25 s | 25 s | 1/1 | 40 s | 40 s |",
        "| 2x straggler | 1/1 | 20 s | 20 s | 1/1 | 25 s | 25 s |",
    ]


RESUME = {
    "fault": "resume",
    "subject": {"run": "r"},
    "start_ts": BASE + 160,
    "params": {"down": 30.0, "event": 0},
    "lost_s": 58.0,
}


def test_a_resume_is_found_by_the_restart_count_and_the_recovery_booked_not_by_an_alert():
    booked = RunRecord("r", restarts=1, recovery_s=90.0)
    score = score_scenario(scenario(RESUME), [], [booked])
    (fault,) = score.faults
    assert fault.found and fault.culprit_right and fault.time_to_detect is None
    # the restart not counted, or the lost steps not booked as recovery: not found
    for record in (RunRecord("r", 0, 90.0), RunRecord("r", 1, 0.9 * 58.0 - 0.1)):
        assert not score_scenario(scenario(RESUME), [], [record]).faults[0].found
    assert not score_scenario(scenario(RESUME), []).faults[0].found


def test_a_hang_of_a_resumed_run_is_a_false_alarm():
    hang = alert("hang", 300, run="r")
    score = score_scenario(scenario(RESUME), [hang], [RunRecord("r", 1, 90.0)])
    assert score.faults[0].found and score.false_alarms == (hang,)
    (row,) = summarize([score])
    assert (row.label, row.found, row.false_alarms, row.ttd_median) == ("resume", 1, 1, None)
