"""`make evaluate`'s cold start with the demo's seed: the scenarios play `make demo`'s own
simulator, a restart's earlier session ends before the session after it, and the faults
scored are those injected in the played time (no database)."""

from __future__ import annotations

import json
from pathlib import Path

from apps.evaluation.services import _scenario_load, demo_specs
from apps.evaluation.services.scenarios import EARLIER_SUFFIX, sim_command
from launcher.stack import simulator_command
from opsboard_agent.sim.cli import build_parser

SIM_OPTIONS = ("nodes", "gpus", "runs", "prefix", "seed", "interval", "noise_cv", "fault")


def options(command: list[str]) -> dict:
    args, _ = build_parser().parse_known_args(command[3:])  # after `python -m package`
    return vars(args)


def test_the_demo_scenarios_play_make_demos_own_simulator(tmp_path):
    demo = options(
        simulator_command(server="http://x", token_file=tmp_path / "t", spool_dir=tmp_path)
    )
    fresh, restarted = demo_specs()
    assert (fresh.name, restarted.name) == ("demo-fresh", "demo-restarted")
    for spec in (fresh, restarted):
        played = options(sim_command(spec, "http://x", tmp_path / "t", tmp_path / "s.json"))
        assert {k: played[k] for k in SIM_OPTIONS} == {k: demo[k] for k in SIM_OPTIONS}
        assert played["spikes"] and played["spike_rate"] == demo["spike_rate"]
        assert played["duration"] == 600 and played["ago"] == 0
        assert spec.group == "demo" and spec.step_s == 5


def test_a_restarts_earlier_session_ends_before_the_session_after_it(tmp_path):
    _, restarted = demo_specs(speed=20)
    earlier = options(
        sim_command(restarted, "http://x", tmp_path / "t", tmp_path / "e.json", earlier=True)
    )
    assert earlier["duration"] == restarted.earlier_s == 100
    # the session after it ends about now, so it began 600 × (1 − 1/20) = 570 s ago: the
    # earlier one ends the restart's gap before that
    assert earlier["ago"] == 570 + restarted.restart_gap_s
    assert (
        earlier["seed"] == 1
        and earlier["fault"]
        == options(sim_command(restarted, "http://x", tmp_path / "t", tmp_path / "s.json"))["fault"]
    )


def scenario_file(path: Path, duration: float, *ats: float) -> None:
    faults = [{"fault": "xid", "at": at, "start_ts": 1000.0 + at, "subject": {}} for at in ats]
    path.write_text(json.dumps({"duration": duration, "faults": faults}))


def test_the_faults_scored_are_those_injected_in_the_played_time(tmp_path):
    fresh, restarted = demo_specs()
    scenario_file(tmp_path / "demo-fresh.json", 600, 120, 300, 660)
    assert [f["at"] for f in _scenario_load(fresh, tmp_path)["faults"]] == [120, 300]
    # after a restart, the earlier session's faults happened too (their alerts stay open)
    scenario_file(tmp_path / "demo-restarted.json", 600, 120, 660)
    scenario_file(tmp_path / f"demo-restarted{EARLIER_SUFFIX}.json", 100, 50, 120)
    assert [f["at"] for f in _scenario_load(restarted, tmp_path)["faults"]] == [50, 120]
