"""The simulator against the real stack: each fault's promised signature, as STORED.

Each test runs `python -m opsboard_agent.sim` (the real agent code: reporters, node agent
loop, spools, senders) at high speed against `live_stack`, waits until the worker has
stored every batch, and reads back StepReport/RunEvent rows and `GET /api/v1/series`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime

import httpx
import pytest

from opsboard_agent.sim.telemetry import GPU_MEM_TOTAL, HW_THERMAL_SLOWDOWN, SW_THERMAL_SLOWDOWN
from tests.sim.helpers import canary_differs
from tests.stackproc import ROOT, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


class Sim:
    """One finished simulator run: its scenario and summary, and readers of what the
    server stored for it."""

    def __init__(self, live_stack, agent_token, tmp_path, *args: str) -> None:
        self.token, self.secret = agent_token
        self.url = live_stack.url
        (tmp_path / "token").write_text(self.secret)
        scenario_path = tmp_path / "scenario.json"
        command = [
            sys.executable,
            "-m",
            "opsboard_agent.sim",
            "--server",
            self.url,
            "--token-file",
            str(tmp_path / "token"),
            "--spool-dir",
            str(tmp_path / "spool"),
            "--scenario-out",
            str(scenario_path),
            "--step-time",
            "1",
            "--interval",
            "2",
            "--check-every",
            "5",
            "--checkpoint-every",
            "20",
            # These tests pin each fault's exact signature step by step: noise off (the
            # noise model has its own tests, tests/sim/test_noise.py).
            "--noise-cv",
            "0",
            "--no-spikes",
            *args,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        self.wall = time.monotonic() - started
        self.finished_at = time.time()
        self.summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert self.summary["ok"] and self.summary["steps"] > 0
        self.scenario = json.loads(scenario_path.read_text())
        self.base = self.scenario["base_ts"]
        wait_until(self._all_stored, 60, "the worker to store every batch", interval=0.25)

    def _all_stored(self) -> bool:
        from apps.ingest.models import InboxBatch

        batches = InboxBatch.objects.filter(token=self.token)
        return batches.exists() and not batches.filter(processed_at__isnull=True).exists()

    def steps(self, run: str) -> dict[int, dict[int, dict]]:
        """{step: {rank: stored fields, with `t` in simulated seconds}}."""
        from apps.runs.models import StepReport

        out: dict[int, dict[int, dict]] = {}
        rows = StepReport.objects.filter(run__cluster=self.token.cluster, run__name=run)
        for row in rows.values():
            row["t"] = row["ts"].timestamp() - self.base
            out.setdefault(row["step"], {})[row["rank"]] = row
        return out

    def events(self, kind: str, **filters) -> list:
        from apps.runs.models import RunEvent

        return list(
            RunEvent.objects.filter(cluster=self.token.cluster, kind=kind, **filters)
            .select_related("node", "run")
            .order_by("ts", "id")
        )

    def t(self, ts: datetime) -> float:
        return ts.timestamp() - self.base

    def series(self, node: str, metric: str, gpu: int | None = None) -> list[tuple[float, float]]:
        """Raw points as (simulated seconds, value), from GET /api/v1/series."""
        params = {
            "node": node,
            "metric": metric,
            "start": self.base - 1,
            "end": self.scenario["end_ts"] + 1,
        }
        if gpu is not None:
            params["gpu"] = gpu
        response = httpx.get(
            f"{self.url}/api/v1/series",
            params=params,
            headers={"Authorization": f"Bearer {self.secret}"},
            timeout=30,
        )
        response.raise_for_status()
        return [(round(ts - self.base, 3), value) for ts, value in response.json()["points"]]


def median(values) -> float:
    return statistics.median(list(values))


def test_compute_checkpoint_and_gpu_faults_are_stored_with_their_signatures(
    live_stack, agent_token, live_db, tmp_path
):
    faults = [
        "straggler:run=0,rank=1,at=40,factor=1.5",
        "sdc:run=0,rank=2,at=30,mode=canary",
        "sdc:run=0,rank=3,at=60,mode=param",
        "nfs-drop:run=0,at=50,stall=30",
        "fabric:run=1,at=20,factor=3,ramp=40",
        "xid:node=2,gpu=0,at=45,code=79",
        "oom-creep:run=1,rank=0,at=60,ramp=60",
    ]
    sim = Sim(
        live_stack,
        agent_token,
        tmp_path,
        *("--nodes", "4", "--gpus", "2", "--runs", "2", "--seed", "11"),
        *("--duration", "150", "--speed", "50"),
        *(arg for spec in faults for arg in ("--fault", spec)),
    )

    # The scenario names what was injected, where and when.
    scenario = sim.scenario
    assert [f["fault"] for f in scenario["faults"]] == [s.split(":")[0] for s in faults]
    assert [f["start_ts"] - sim.base for f in scenario["faults"]] == [40, 30, 60, 50, 20, 45, 60]
    assert scenario["faults"][0]["subject"] == {
        "run": "sim-run-0",
        "node": "sim-node-00",
        "rank": 1,
        "gpu": 1,
    }
    assert scenario["faults"][0]["params"] == {"factor": 1.5}
    assert scenario["faults"][5]["subject"] == {
        "run": "sim-run-1",
        "node": "sim-node-02",
        "rank": 0,
        "gpu": 0,
    }
    assert scenario["faults"][6]["oom_ts"] == sim.base + 120
    assert scenario["halts"] == {"sim-run-1": {"ts": sim.base + 120, "at": 120, "reason": "oom"}}
    runs = {r["run"]: r for r in scenario["layout"]["runs"]}
    assert runs["sim-run-1"]["nodes"] == ["sim-node-02", "sim-node-03"]
    assert runs["sim-run-1"]["ranks"][3] == {
        "rank": 3,
        "node": "sim-node-03",
        "gpu": 1,
        "shard": "tp0-pp0",
    }

    # 150 simulated seconds at 50x take at least 3 s, and no timestamp is in the future.
    assert sim.wall >= 3
    # Everything stored lies on the simulated timeline, and every step has all 4 ranks.
    run0 = sim.steps("sim-run-0")
    assert sim.base + 150 <= sim.finished_at
    assert len(run0) > 100 and all(len(ranks) == 4 for ranks in run0.values())
    assert all(0 < r["t"] <= 150 for ranks in run0.values() for r in ranks.values())
    assert sim.summary["steps"] == sum(map(len, run0.values())) + sum(
        map(len, sim.steps("sim-run-1").values())
    )

    # straggler: rank 1 computes ≥ 1.5× its peers and waits least; everyone's step grows.
    before = [r for r in run0.values() if r[0]["t"] < 38]
    after = [r for r in run0.values() if r[0]["t"] > 43]
    for ranks in after:
        peers = median(ranks[r]["compute_time"] for r in (0, 2, 3))
        assert ranks[1]["compute_time"] >= 1.5 * 0.96 * peers
        assert min(ranks, key=lambda r: ranks[r]["comm_wait"]) == 1
    for rank in (0, 2, 3):
        assert median(r[rank]["comm_wait"] for r in after) > 2 * median(
            r[rank]["comm_wait"] for r in before
        )
    assert median(r[0]["step_time"] for r in after) > 1.3 * median(
        r[0]["step_time"] for r in before
    )

    # sdc: rank 2's canary disagrees from t=30 while the checksums agree; rank 3's
    # parameters differ from its flip at t=60 on.
    checked = [r for r in run0.values() if r[0]["canary_norm"] is not None]
    assert len(checked) > 20
    for ranks in checked:
        started = ranks[0]["t"] - ranks[0]["step_time"]
        canary = {
            rank: {"norm": r["canary_norm"], "proj": r["canary_proj"]} for rank, r in ranks.items()
        }
        assert canary_differs(canary[0], canary[2]) == (started >= 30)
        assert not canary_differs(canary[0], canary[1])
        assert not canary_differs(canary[0], canary[3])
        assert len({r["grad_checksum"] for r in ranks.values()}) == 1
        assert ranks[0]["param_checksum"] == ranks[1]["param_checksum"]
        assert ranks[0]["param_checksum"] == ranks[2]["param_checksum"]
        assert (ranks[3]["param_checksum"] != ranks[0]["param_checksum"]) == (started >= 60)

    # nfs-drop: local checkpoints complete; durable uploads started from t=50 on fail.
    checkpoints = sim.events("checkpoint", run__name="sim-run-0")
    phases = {}
    for event in checkpoints:
        phases.setdefault((event.data["tier"], event.data["state"]), []).append(event)
    local_done = [e.step for e in phases[("local", "completed")]]
    assert local_done == [e.step for e in phases[("durable", "started")]] and len(local_done) >= 5
    durable_start = {e.step: sim.t(e.ts) for e in phases[("durable", "started")]}
    assert all(durable_start[e.step] < 50 for e in phases[("durable", "completed")])
    failed = phases[("durable", "failed")]
    assert [e.step for e in failed] == [
        step for step, t in durable_start.items() if t >= 50 and t + 30 <= 150
    ]
    assert len(failed) >= 2 and all(e.data["duration"] == 30 for e in failed)
    assert all(e.rank == 0 and e.node.name == "sim-node-00" for e in checkpoints)

    # fabric: every rank of run 1 waits ever longer in collectives; compute is unchanged.
    run1 = sim.steps("sim-run-1")
    early = [r for r in run1.values() if r[0]["t"] < 19]
    late = [r for r in run1.values() if 65 < r[0]["t"] <= 120]
    for rank in range(4):
        assert median(r[rank]["comm_wait"] for r in late) > 2.5 * median(
            r[rank]["comm_wait"] for r in early
        )
        ratio = median(r[rank]["compute_time"] for r in late) / median(
            r[rank]["compute_time"] for r in early
        )
        assert 0.97 < ratio < 1.03

    # xid: a node event (no run) naming the GPU and the code.
    (xid,) = sim.events("xid")
    assert (xid.node.name, xid.gpu, xid.data["code"], xid.run) == ("sim-node-02", 0, 79, None)
    assert sim.t(xid.ts) == pytest.approx(45, abs=1e-3)

    # oom-creep: rank 0's GPU fills up to the total, then an oom event; the run stops.
    mem = sim.series("sim-node-02", "gpu.mem_used_bytes", gpu=0)
    assert max(v for t, v in mem if t < 60) < 0.8 * GPU_MEM_TOTAL
    assert max(v for t, v in mem if 100 < t <= 120) >= 0.99 * GPU_MEM_TOTAL
    assert max(v for t, v in mem if t > 120) < 0.01 * GPU_MEM_TOTAL
    (oom,) = sim.events("oom")
    assert (oom.rank, oom.node.name, oom.run.name) == (0, "sim-node-02", "sim-run-1")
    assert "sim-node-02" in oom.data["message"] and sim.t(oom.ts) == pytest.approx(120, abs=1e-3)
    assert max(r["t"] for ranks in run1.values() for r in ranks.values()) <= 120


def test_hang_node_loss_input_bound_and_thermal_are_stored_with_their_signatures(
    live_stack, agent_token, live_db, tmp_path
):
    sim = Sim(
        live_stack,
        agent_token,
        tmp_path,
        *("--nodes", "4", "--gpus", "2", "--runs", "3", "--seed", "5"),
        *("--duration", "120", "--speed", "40"),
        *("--fault", "node-loss:node=1,at=60"),
        *("--fault", "hang:run=1,at=50"),
        *("--fault", "thermal:node=2,gpu=1,at=10,temp=93,ramp=30"),
        *("--fault", "input-bound:node=3,at=40,factor=1.0"),
    )
    assert sim.scenario["halts"] == {
        "sim-run-0": {"ts": sim.base + 60, "at": 60, "reason": "node-loss"},
        "sim-run-1": {"ts": sim.base + 50, "at": 50, "reason": "hang"},
    }

    # node-loss: sim-node-01 stops sending at 60; its run stops stepping; others go on.
    lost = sim.series("sim-node-01", "host.cpu_util")
    alive = sim.series("sim-node-00", "host.cpu_util")
    assert lost and max(t for t, _ in lost) < 60 and max(t for t, _ in alive) == 120
    assert max(t for t, _ in sim.series("sim-node-01", "gpu.util", gpu=1)) < 60
    run0 = sim.steps("sim-run-0")
    assert len(run0) > 40 and max(r["t"] for s in run0.values() for r in s.values()) <= 60

    # hang: run 1 stops stepping at 50; its node's telemetry goes on (GPUs spin).
    run1 = sim.steps("sim-run-1")
    assert len(run1) > 40 and max(r["t"] for s in run1.values() for r in s.values()) <= 50
    util = sim.series("sim-node-02", "gpu.util", gpu=0)
    assert max(t for t, _ in util) == 120 and min(v for t, v in util if t > 50) == 100.0

    # thermal: sim-node-02's GPU 1 passes 85 °C, sets both thermal bits, slows its clock.
    temp = dict(sim.series("sim-node-02", "gpu.temp_c", gpu=1))
    bits = dict(sim.series("sim-node-02", "gpu.throttle_reasons", gpu=1))
    clock = dict(sim.series("sim-node-02", "gpu.sm_clock_mhz", gpu=1))
    assert max(temp[t] for t in temp if t < 10) < 70 and max(temp.values()) > 90
    thermal = HW_THERMAL_SLOWDOWN | SW_THERMAL_SLOWDOWN
    assert sum(temp[t] > 85 for t in temp) > 20
    for t in temp:
        assert (int(bits[t]) & thermal == thermal) == (temp[t] > 85)
    assert (
        max(clock[t] for t in temp if temp[t] > 90) < 1700 < min(clock[t] for t in clock if t < 10)
    )
    assert max(v for _, v in sim.series("sim-node-02", "gpu.temp_c", gpu=0)) < 70

    # input-bound: run 2's ranks wait on data from 40 on and their GPUs idle.
    for ranks in (r for r in sim.steps("sim-run-2").values() if r[0]["t"] > 42):
        for report in ranks.values():
            assert report["data_time"] > report["compute_time"] > report["comm_wait"]
    gpu_util = sim.series("sim-node-03", "gpu.util", gpu=1)
    assert min(v for t, v in gpu_util if t < 40) > 90 > 60 > max(v for t, v in gpu_util if t > 40)
    assert min(v for t, v in sim.series("sim-node-03", "host.cpu_util") if t > 40) > 90


def test_runs_end_only_when_asked_and_then_read_finished(
    live_stack, agent_token, live_db, tmp_path
):
    from apps.runs.models import Run

    short = ("--nodes", "1", "--gpus", "2", "--duration", "20", "--speed", "50")
    for name in ("kept", "ended"):
        (tmp_path / name).mkdir()
    Sim(live_stack, agent_token, tmp_path / "kept", *short, "--prefix", "kept")
    Sim(live_stack, agent_token, tmp_path / "ended", *short, "--prefix", "ended", "--end-runs")
    states = dict(Run.objects.filter(cluster=agent_token[0].cluster).values_list("name", "state"))
    assert {name.split("-")[0]: state for name, state in states.items()} == {
        "kept": "running",
        "ended": "finished",
    }, states
