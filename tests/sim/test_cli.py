"""The command line without a server (`--dry-run`): the scenario file, time anchoring and
usage errors."""

from __future__ import annotations

import json
import time

import pytest

from opsboard_agent.sim import cli

ARGS = [
    "--dry-run",
    *("--nodes", "3", "--gpus", "4", "--runs", "2", "--seed", "42"),
    *("--duration", "300", "--speed", "10"),
    *("--fault", "straggler:run=1,rank=2,at=60,factor=1.3"),
    *("--fault", "oom-creep:node=1,gpu=3,at=100,ramp=50"),
    *("--fault", "xid:node=2,gpu=1,at=12.5,code=48"),
    *("--fault", "hang:run=1,at=250"),
]


def without_anchor(value, base):
    """The scenario with every absolute time made relative to `base`."""
    if isinstance(value, dict):
        return {
            k: (v - base if k.endswith("_ts") or k == "ts" else without_anchor(v, base))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [without_anchor(v, base) for v in value]
    return value


def test_the_same_seed_writes_the_same_scenario_apart_from_the_base_time(tmp_path, capsys):
    assert cli.main([*ARGS, "--scenario-out", str(tmp_path / "a.json")]) == 0
    first_counts = capsys.readouterr().out
    time.sleep(0.01)
    assert cli.main([*ARGS, "--scenario-out", str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out == first_counts
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a["base_ts"] != b["base_ts"]
    assert without_anchor(a, a["base_ts"]) == without_anchor(b, b["base_ts"])


def test_the_scenario_lists_layout_and_faults_on_the_simulated_timeline(tmp_path, capsys):
    before = time.time()
    assert cli.main([*ARGS, "--scenario-out", str(tmp_path / "s.json")]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["steps"] > 0 and counts["samples"] > 0 and counts["events"] > 3
    s = json.loads((tmp_path / "s.json").read_text())
    # The timeline ends about "now" once the 300 s have played at 10x (30 s of wall time).
    assert before - 270 <= s["base_ts"] <= time.time() - 270
    assert s["end_ts"] == s["base_ts"] + 300
    assert s["layout"]["nodes"] == ["sim-node-00", "sim-node-01", "sim-node-02"]
    assert [r["nodes"] for r in s["layout"]["runs"]] == [
        ["sim-node-00", "sim-node-01"],
        ["sim-node-02"],
    ]
    assert len(s["layout"]["runs"][0]["ranks"]) == 8
    straggler, oom, xid, hang = s["faults"]
    assert straggler == {
        "fault": "straggler",
        "subject": {"run": "sim-run-1", "node": "sim-node-02", "rank": 2, "gpu": 2},
        "at": 60.0,
        "start_ts": s["base_ts"] + 60,
        "params": {"factor": 1.3},
    }
    assert oom["subject"] == {"run": "sim-run-0", "node": "sim-node-01", "rank": 7, "gpu": 3}
    assert oom["oom_ts"] == s["base_ts"] + 150
    assert xid["subject"]["node"] == "sim-node-02" and xid["params"] == {"code": 48}
    assert hang["subject"] == {"run": "sim-run-1"}
    assert s["halts"] == {
        "sim-run-0": {"at": 150.0, "ts": s["base_ts"] + 150, "reason": "oom"},
        "sim-run-1": {"at": 250.0, "ts": s["base_ts"] + 250, "reason": "hang"},
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--dry-run", "--duration", str(8 * 86400)],
        ["--dry-run", "--speed", "0.5"],
        ["--dry-run", "--fault", "straggler:rank=99"],
        ["--dry-run", "--runs", "3", "--nodes", "2"],
        ["--server", "http://127.0.0.1:9"],  # no token
    ],
)
def test_it_refuses_what_it_cannot_simulate(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2


def test_ago_ends_the_timeline_that_long_before_now(tmp_path, capsys):
    # an earlier session of a cluster simulated again (the evaluation's restarted demo)
    before = time.time()
    assert cli.main([*ARGS, "--ago", "900", "--scenario-out", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert before - 270 - 900 <= s["base_ts"] <= time.time() - 270 - 900
    for ago in ("-1", str(6 * 86400)):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*ARGS, "--ago", ago])
        assert exit_info.value.code == 2
