"""Against the simulator: no false alarm on healthy runs, each fault caught by name."""

from __future__ import annotations

import pytest

from detectors import detect_all
from tests.detectors.simwin import BASE_TS, play


@pytest.mark.parametrize(("seed", "nodes", "tp"), [(0, 2, 1), (1, 4, 2), (7, 3, 4), (11, 2, 8)])
def test_a_healthy_simulated_cluster_raises_nothing(seed, nodes, tp):
    window, now = play(duration=400, nodes=nodes, tp=tp, seed=seed, check_every=5)
    assert detect_all(window, now) == []


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("straggler:rank=5,at=60,factor=1.35", {("straggler", "run:sim-run-0/rank:5")}),
        ("sdc:rank=3,mode=canary,at=100", {("sdc", "run:sim-run-0/rank:3")}),
        ("sdc:rank=3,mode=param,at=100", {("sdc", "run:sim-run-0/rank:3")}),
        ("input-bound:node=1,at=60", {("input_bound", "run:sim-run-0/node:sim-node-01")}),
        ("hang:at=100", {("hang", "run:sim-run-0")}),
        (
            "thermal:node=0,gpu=1,at=60",
            {("thermal", "node:sim-node-00/gpu:1"), ("straggler", "run:sim-run-0/rank:1")},
        ),
        ("xid:node=1,gpu=3,at=100,code=79", {("xid", "node:sim-node-01/gpu:3/xid:79")}),
        (
            "node-loss:node=1,at=100",
            {("heartbeat", "node:sim-node-01"), ("hang", "run:sim-run-0")},
        ),
        ("nfs-drop:at=0", {("checkpoint_upload", "run:sim-run-0")}),
        ("fabric:at=120", {("fabric", "run:sim-run-0")}),
        (
            "oom-creep:rank=2,at=100,ramp=60",
            {("oom", "run:sim-run-0/rank:2"), ("hang", "run:sim-run-0")},
        ),
    ],
)
def test_each_simulated_fault_is_found_and_nothing_else(fault, expected):
    window, now = play(fault, duration=300)
    assert {(f.kind, f.subject) for f in detect_all(window, now)} == expected


def test_memory_creeping_towards_the_total_is_an_oom_risk_before_the_oom():
    window, _ = play("oom-creep:rank=2,at=100,ramp=120", duration=170)
    found = detect_all(window, BASE_TS + 170)
    assert ("oom_risk", "node:sim-node-00/gpu:2") in {(f.kind, f.subject) for f in found}
    assert not any(f.kind == "oom" for f in found)


def test_a_straggler_on_a_large_tp_run_names_its_node():
    window, now = play("straggler:rank=13,at=0,factor=1.35", duration=120, nodes=4, tp=2)
    (f,) = detect_all(window, now)
    assert f.node == "sim-node-01" and "rank 13 on sim-node-01" in f.summary


def test_a_straggler_on_a_hot_gpu_names_the_heat_as_its_probable_cause():
    window, now = play("thermal:node=0,gpu=1,at=60", duration=300)
    found = {f.kind: f for f in detect_all(window, now)}
    straggler = found["straggler"]
    assert straggler.evidence["probable_cause"] == ["node:sim-node-00/gpu:1"]
    assert "probably because sim-node-00 is throttling (GPU 1 thermal)" in straggler.summary
    assert "probable_cause" not in found["thermal"].evidence
