"""The checkpoint-now agreement under a real `torchrun` (2 CPU ranks, gloo): a rank whose
reporter is off (no server, no token) still takes part and both ranks save at the same
steps; a step with nothing pending costs no collective and no store call (the agreement
talks to the job's store only while a request is pending); a rank that never takes part
makes the round abort and the command fail naming it, instead of anyone waiting forever;
a job of several ranks without a process group fails the command with that reason instead
of rank 0 saving alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from opsboard_agent.reporter import Reporter
from tests.agent.command_stub import TOKEN, CommandStub
from tests.agent.conftest import REPO

pytestmark = pytest.mark.timeout(180)

# Each rank: a reporter (rank 1's without a server), 40 steps, the steps it was told to save
# at and what the agreement cost it, written to a file of its own. Every torch.distributed
# collective and group creation made inside `checkpoint_requested` is counted.
JOB = f"""
import json, os, sys, time
import torch
import torch.distributed as dist
from opsboard_agent.reporter import Reporter

dist.init_process_group("gloo")
rank = dist.get_rank()
inside = [False]
collectives = [0]
for name in ("broadcast", "all_reduce", "all_gather", "barrier", "new_group", "send", "recv"):
    def counted(*args, _real=getattr(dist, name), **kwargs):
        collectives[0] += inside[0]
        return _real(*args, **kwargs)
    setattr(dist, name, counted)
server = os.environ["STUB_URL"] if rank == 0 else None
reporter = Reporter.from_env(run="run-1", server=server, token="{TOKEN}" if server else None,
                             flush_interval=0.2)
skip = int(os.environ.get("SKIP_RANK", "-1"))  # this rank never calls checkpoint_requested
slow = int(os.environ.get("SLOW_RANK", "0"))  # this rank is late by 1.5 s at step 5
saved = []
for step in range(1, 41):
    time.sleep(0.05)
    dist.all_reduce(torch.ones(1))  # the training's own collective, on the default group
    reporter.step(step)
    if rank != skip:
        inside[0] = True
        if reporter.checkpoint_requested(step):
            saved.append(step)
        inside[0] = False
    if step == 5 and rank == slow:
        time.sleep(1.5)  # the long poll has the command by now
    if step == 25 and rank == 0:
        reporter.request_checkpoint()  # the program's own: a second round
with open(os.path.join(sys.argv[1], f"rank-{{rank}}.json"), "w") as out:
    json.dump({{"saved": saved, "collectives": collectives[0],
               "store_calls": reporter.checkpoints.store_calls}}, out)
reporter.close(drain_timeout=2)
dist.destroy_process_group()
"""


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def torchrun_job(stub: CommandStub, tmp_path, **env: str) -> list[dict]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=150,
        env={**os.environ, "PYTHONPATH": str(REPO), "OPSBOARD_NODE": "node-01",
             "STUB_URL": stub.url, "OPSBOARD_COMMANDS": "on", **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert time.monotonic() - started < 120  # nobody waited for a rank that never came
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("slow_rank", [0, 1], ids=["rank-0-late", "rank-1-late"])
def test_a_rank_without_a_reporter_still_agrees_and_both_save_at_one_step(
    stub, tmp_path, slow_rank
):
    command_id = stub.issue("checkpoint", run="run-1")
    ranks = torchrun_job(stub, tmp_path, SLOW_RANK=str(slow_rank))
    # the operator's command, then the program's own request at step 25: two rounds
    assert ranks[0]["saved"] == ranks[1]["saved"] and len(ranks[0]["saved"]) == 2
    assert ranks[0]["saved"][1] > 25
    # 40 steps, two rounds: no collective at all; store calls only in the rounds (rank 0
    # opens each round: one more call per round)
    assert ranks[0]["collectives"] == ranks[1]["collectives"] == 0
    assert ranks[1]["store_calls"] <= 2 * 2 and ranks[0]["store_calls"] <= 3 * 2
    (ack,) = stub.acks_of(command_id)
    assert ack["state"] == "accepted" and ack["step"] == ranks[0]["saved"][0]


def test_a_rank_that_never_takes_part_aborts_the_round_naming_it(stub, tmp_path):
    command_id = stub.issue("checkpoint", run="run-1")
    ranks = torchrun_job(stub, tmp_path, SKIP_RANK="1", OPSBOARD_CHECKPOINT_AGREE_TIMEOUT_S="3")
    assert ranks[0]["saved"] == ranks[1]["saved"] == []
    stub.wait_for(lambda: stub.states[command_id] == "failed", 10, "failed")
    (ack,) = stub.acks_of(command_id)
    assert "rank 1 did not take part within 3 s" in ack["detail"]


def test_several_ranks_without_a_process_group_fail_the_command(stub, tmp_path):
    command_id = stub.issue("checkpoint", run="run-1")
    reporter = Reporter(run="run-1", server=stub.url, token=TOKEN, node="node-01", rank=0,
                        world_size=2, spool_dir=tmp_path / "spool", flush_interval=0.2,
                        commands=True)  # fmt: skip
    try:
        saved = []
        deadline = time.monotonic() + 20
        step = 0
        while not stub.acks_of(command_id) and time.monotonic() < deadline:
            step += 1
            reporter.step(step)
            saved += [step] if reporter.checkpoint_requested(step) else []
            time.sleep(0.05)
        stub.wait_for(lambda: stub.states[command_id] == "failed", 10, "failed")
    finally:
        reporter.close(drain_timeout=1)
    assert saved == []
    (ack,) = stub.acks_of(command_id)
    assert "no torch.distributed process group" in ack["detail"]
