"""The pure model: determinism and the signature of each fault in the generated data."""

from __future__ import annotations

import math

import pytest

from opsboard_agent.sim.layout import layout_build
from opsboard_agent.sim.model import MAX_SM_CLOCK_MHZ
from opsboard_agent.sim.telemetry import (
    GPU_MEM_TOTAL,
    HW_THERMAL_SLOWDOWN,
    SW_THERMAL_SLOWDOWN,
)
from tests.sim.helpers import by_step, canary_differs, median, model_build, play, series

N0, N1 = "sim-node-00", "sim-node-01"


def test_it_gives_the_same_records_for_the_same_seed():
    faults = ("straggler:rank=1,at=10", "sdc:rank=2,at=20", "xid:node=1,gpu=0,at=5")
    assert play(*faults, seed=7) == play(*faults, seed=7)
    assert play(*faults, seed=7).steps != play(*faults, seed=8).steps


def test_it_gives_the_same_records_however_time_is_sliced():
    faults = ("oom-creep:rank=3,at=10,ramp=30", "nfs-drop:at=0", "thermal:node=0,gpu=1,at=5")
    whole = model_build(*faults).advance(90)
    model = model_build(*faults)
    sliced = [model.advance(t * 0.7) for t in range(1, 129)] + [model.advance(90)]
    assert [s for tick in sliced for s in tick.steps] == whole.steps
    assert [e for tick in sliced for e in tick.events] == whole.events
    assert [s for tick in sliced for s in tick.samples] == whole.samples


def test_a_healthy_run_agrees_and_its_step_splits_add_up():
    tick = play(duration=200, nodes=2, gpus=4, tp=2)
    steps = by_step(tick.steps)
    assert sorted(steps) == list(range(len(steps))) and len(steps) > 150
    for number, ranks in steps.items():
        assert len(ranks) == 8
        for report in ranks.values():
            parts = ("data_time", "h2d_time", "compute_time", "comm_wait")
            assert math.isclose(sum(report[p] for p in parts), report["step_time"])
            assert report["comm_wait"] > 0 and report["tokens"] == 32768
        if number % 5 == 0:
            for shard in ("tp0-pp0", "tp1-pp0"):
                replicas = [r for r in ranks.values() if r["shard"] == shard]
                assert len(replicas) == 4
                assert len({r["grad_checksum"] for r in replicas}) == 1
                assert len({r["param_checksum"] for r in replicas}) == 1
                assert not any(canary_differs(replicas[0]["canary"], r["canary"]) for r in replicas)
            assert ranks[0]["grad_checksum"] != ranks[1]["grad_checksum"]  # other shard
        else:
            assert "grad_checksum" not in ranks[0]
    assert steps[150][0]["loss"] < steps[1][0]["loss"] * 0.8  # it learns
    assert 0.9 < median(r["step_time"] for r in steps[50].values()) < 1.1


def test_a_healthy_cluster_checkpoints_in_two_phases():
    tick = play(duration=120)
    ckpt = [(e.fields["step"], e.fields["tier"], e.fields["state"]) for e in tick.events]
    assert [c for c in ckpt if c[0] == 20] == [
        (20, "local", "started"),
        (20, "local", "completed"),
        (20, "durable", "started"),
        (20, "durable", "completed"),
    ]
    assert {c[0] for c in ckpt} >= {20, 40, 60, 80}
    assert all(e.node == N0 and e.fields["rank"] == 0 for e in tick.events)


def test_a_straggler_computes_slower_and_waits_least_while_everyone_waits_for_it():
    tick = play("straggler:rank=1,at=60,factor=1.4")
    steps = by_step(tick.steps)
    before = [n for n, r in steps.items() if r[0]["t"] < 55]
    after = [n for n, r in steps.items() if r[0]["t"] > 65]
    for number in after:
        ranks = steps[number]
        peers = median(ranks[r]["compute_time"] for r in (0, 2, 3))
        assert ranks[1]["compute_time"] >= 1.4 * 0.96 * peers
        assert min(ranks, key=lambda r: ranks[r]["comm_wait"]) == 1
    for rank in (0, 2, 3):
        assert median(steps[n][rank]["comm_wait"] for n in after) > 1.5 * median(
            steps[n][rank]["comm_wait"] for n in before
        )
    for rank in range(4):
        assert median(steps[n][rank]["step_time"] for n in after) > 1.2 * median(
            steps[n][rank]["step_time"] for n in before
        )


def test_a_canary_sdc_shows_only_in_that_ranks_canary():
    tick = play("sdc:rank=2,at=40,mode=canary")
    checked = {n: r for n, r in by_step(tick.steps).items() if "canary" in r[0]}
    for ranks in checked.values():
        assert len({r["grad_checksum"] for r in ranks.values()}) == 1
        assert len({r["param_checksum"] for r in ranks.values()}) == 1
        faulty = ranks[0]["t"] - ranks[0]["step_time"] >= 40
        assert canary_differs(ranks[0]["canary"], ranks[2]["canary"]) == faulty
        assert not canary_differs(ranks[0]["canary"], ranks[3]["canary"])
    assert any(r[0]["t"] > 60 for r in checked.values())


def test_a_param_sdc_makes_that_ranks_param_checksum_differ_from_the_flip_on():
    tick = play("sdc:rank=3,at=50,mode=param")
    checked = {n: r for n, r in by_step(tick.steps).items() if "canary" in r[0]}
    flipped = []
    for ranks in checked.values():
        assert len({r["grad_checksum"] for r in ranks.values()}) == 1
        assert (
            ranks[0]["param_checksum"] == ranks[1]["param_checksum"] == ranks[2]["param_checksum"]
        )
        flipped.append(ranks[3]["param_checksum"] != ranks[0]["param_checksum"])
        assert not canary_differs(ranks[0]["canary"], ranks[3]["canary"])
    first = flipped.index(True)
    assert first > 3 and all(flipped[first:]) and not any(flipped[:first])


def test_an_input_bound_node_waits_on_data_and_its_gpus_idle():
    tick = play("input-bound:node=1,at=60,factor=1.0")
    steps = by_step(tick.steps)
    for ranks in (r for r in steps.values() if r[0]["t"] > 62):
        for rank in (2, 3):
            report = ranks[rank]
            assert report["data_time"] > report["compute_time"] > report["comm_wait"]
        assert ranks[0]["data_time"] < 0.1
    util_before = [v for t, v in series(tick.samples, N1, "gpu.util", 0) if t < 60]
    util_after = [v for t, v in series(tick.samples, N1, "gpu.util", 0) if t >= 60]
    assert min(util_before) > 90 and max(util_after) < 60
    cpu = [v for t, v in series(tick.samples, N1, "host.cpu_util") if t >= 60]
    assert min(cpu) > 90


def test_a_hang_stops_the_steps_but_not_the_telemetry():
    tick = play("hang:at=50")
    assert tick.steps and max(s.t for s in tick.steps) <= 50
    assert max(s.t for s in tick.samples if s.node == N1) == 120
    util = [v for t, v in series(tick.samples, N0, "gpu.util", 1) if t > 50]
    assert util and min(util) == 100.0  # NCCL kernels spin


@pytest.mark.parametrize("event", [1, 0])
def test_a_resume_crashes_then_steps_again_from_the_last_checkpoint(event):
    # checkpoints every 20 steps (model_build): the one at step 40 is saved by t = 50
    model = model_build(f"resume:at=50,down=10,event={event}")
    tick = model.advance(120)
    (resume,) = model.resumes["sim-run-0"]
    assert (resume.checkpoint_step, resume.resume_step, resume.restart_t) == (40, 41, 60.0)
    rank0 = [(s.t, s.fields["step"]) for s in tick.steps if s.rank == 0]
    before = [step for t, step in rank0 if t < 50]
    after = [step for t, step in rank0 if t > 60]
    assert before == list(range(before[-1] + 1)) and before[-1] == resume.crash_step - 1
    assert after[0] == 41 and after == list(range(41, 41 + len(after)))  # it went back
    assert not [t for t, _ in rank0 if 50 <= t <= 60]  # down: nothing ends
    assert resume.lost_from == next(t for t, step in rank0 if step == 40)
    assert resume.lost_to == next(t for t, step in rank0 if step == resume.crash_step - 1)
    util = [v for t, v in series(tick.samples, N0, "gpu.util", 0) if 50 < t < 60]
    assert util and max(util) < 10.0  # the crashed job's GPUs idle
    restarts = [e for e in tick.events if e.fields["kind"] == "restart"]
    assert [(e.t, e.run, e.rank) for e in restarts] == ([(60.0, "sim-run-0", 0)] if event else [])
    # the same however time is sliced (the crash is met mid-advance)
    sliced = model_build(f"resume:at=50,down=10,event={event}")
    steps = [s for t in range(1, 25) for s in sliced.advance(t * 5.0).steps]
    assert steps == tick.steps


def test_oom_creep_fills_the_gpu_then_reports_an_oom_and_the_run_stops():
    tick = play("oom-creep:rank=2,at=20,ramp=60")
    mem = series(tick.samples, N1, "gpu.mem_used_bytes", 0)
    climbing = [v for t, v in mem if 20 <= t <= 80]
    assert climbing == sorted(climbing) and climbing[-1] >= 0.99 * GPU_MEM_TOTAL
    assert max(v for t, v in mem if t < 20) < 0.8 * GPU_MEM_TOTAL
    assert max(v for t, v in mem if t > 80) < 0.01 * GPU_MEM_TOTAL  # the process is gone
    peer = [v for t, v in series(tick.samples, N1, "gpu.mem_used_bytes", 1) if t <= 80]
    assert max(peer) < 0.8 * GPU_MEM_TOTAL
    (oom,) = [e for e in tick.events if e.fields["kind"] == "oom"]
    assert (oom.t, oom.node, oom.rank, oom.fields["rank"]) == (80, N1, 2, 2)
    assert N1 in oom.fields["message"] and "rank 2" in oom.fields["message"]
    assert max(s.t for s in tick.steps) <= 80
    assert all(v == 0 for t, v in series(tick.samples, N0, "gpu.util", 0) if t > 80)


def test_a_thermal_fault_heats_the_gpu_sets_the_throttle_bits_and_drops_the_clock():
    tick = play("thermal:node=1,gpu=1,at=30,temp=93,ramp=40")
    temp = dict(series(tick.samples, N1, "gpu.temp_c", 1))
    bits = dict(series(tick.samples, N1, "gpu.throttle_reasons", 1))
    clock = dict(series(tick.samples, N1, "gpu.sm_clock_mhz", 1))
    assert max(temp[t] for t in temp if t < 30) < 70 and min(temp[t] for t in temp if t > 70) > 90
    thermal = HW_THERMAL_SLOWDOWN | SW_THERMAL_SLOWDOWN
    for t in temp:
        hot = temp[t] > 85
        assert (int(bits[t]) & thermal == thermal) == hot
        assert (clock[t] < 0.8 * MAX_SM_CLOCK_MHZ) == (temp[t] > 90)
    assert max(v for _, v in series(tick.samples, N1, "gpu.temp_c", 0)) < 70
    # A throttled GPU computes slower: its rank becomes the run's straggler.
    late = [r for r in by_step(tick.steps).values() if r[0]["t"] > 75]
    assert all(r[3]["compute_time"] > 1.2 * r[2]["compute_time"] for r in late)


def test_an_xid_is_a_node_event_naming_the_gpu_and_code():
    tick = play("xid:node=1,gpu=1,at=33,code=48", duration=60)
    (xid,) = [e for e in tick.events if e.fields["kind"] == "xid"]
    assert (xid.t, xid.node, xid.run, xid.fields["gpu"], xid.fields["code"]) == (
        33,
        N1,
        None,
        1,
        48,
    )


def test_a_lost_node_sends_nothing_and_its_run_stops_stepping():
    tick = play("node-loss:node=1,at=45", duration=120)
    assert max(s.t for s in tick.samples if s.node == N1) < 45
    assert max(s.t for s in tick.samples if s.node == N0) == 120
    assert max(s.t for s in tick.steps) <= 45
    assert all(e.t < 45 for e in tick.events if e.node == N1)


def test_an_nfs_drop_lets_local_checkpoints_complete_and_durable_ones_fail():
    tick = play("nfs-drop:at=30,stall=40", duration=200)
    states: dict[tuple[str, str], list[int]] = {}
    for e in tick.events:
        states.setdefault((e.fields["tier"], e.fields["state"]), []).append(e.fields["step"])
    assert states[("local", "completed")] == states[("durable", "started")]
    assert len(states[("local", "completed")]) >= 8
    assert states[("durable", "completed")] == [20]  # uploaded before the drop
    failed_steps = states[("durable", "failed")]  # the last uploads fail after the end
    assert len(failed_steps) >= 5
    assert failed_steps == states[("durable", "started")][1 : len(failed_steps) + 1]
    failed = [e for e in tick.events if e.fields["state"] == "failed"]
    assert all(e.fields["duration"] == 40 for e in failed)


def test_a_fabric_fault_stretches_every_ranks_comm_wait_but_not_compute():
    tick = play("fabric:at=30,factor=3,ramp=60")
    steps = by_step(tick.steps)
    early = [r for r in steps.values() if r[0]["t"] < 28]
    late = [r for r in steps.values() if r[0]["t"] > 95]
    for rank in range(4):
        assert median(r[rank]["comm_wait"] for r in late) > 2.5 * median(
            r[rank]["comm_wait"] for r in early
        )
        compute_ratio = median(r[rank]["compute_time"] for r in late) / median(
            r[rank]["compute_time"] for r in early
        )
        assert 0.98 < compute_ratio < 1.02


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("meltdown:rank=1", "unknown fault"),
        ("straggler:rank=9", "has ranks 0..3"),
        ("straggler:rank=1,speed=2", "unknown speed"),
        ("straggler:at=5", "name rank=N"),
        ("sdc:rank=1,mode=cosmic", "mode must be"),
        ("xid:node=7,gpu=0", "no node"),
        ("fabric:factor=0", "factor must be > 0"),
        ("hang:at=-1", "at must be >= 0"),
        ("hang:run=3", "no run"),
        ("node-loss:at=3", "name the node"),
        ("straggler:rank", "is not key=value"),
        ("resume:down=0", "down must be > 0"),
        ("resume:event=2", "event must be 0 or 1"),
    ],
)
def test_it_rejects_bad_fault_specs(spec, error):
    with pytest.raises(ValueError, match=error):
        model_build(spec)


def test_it_resolves_fault_subjects_from_what_the_spec_names():
    layout = layout_build(nodes=4, gpus=2, runs=2)
    from opsboard_agent.sim.faults import fault_parse

    assert fault_parse("thermal:rank=3,run=1", layout).subject() == {
        "run": "sim-run-1",
        "node": "sim-node-03",
        "rank": 3,
        "gpu": 1,
    }
    assert fault_parse("oom-creep:node=sim-node-02,gpu=1", layout).subject()["rank"] == 1
    assert fault_parse("node-loss:node=1", layout).subject() == {
        "run": "sim-run-0",
        "node": "sim-node-01",
    }
    assert fault_parse("input-bound:rank=2,run=1", layout).subject()["node"] == "sim-node-03"
    assert fault_parse("fabric:run=sim-run-1", layout).subject() == {"run": "sim-run-1"}
