"""The checkpoint-now agreement under a real `torchrun` (2 CPU ranks, gloo): a rank whose
reporter is off (no server, no token) still takes part, so nobody is left waiting in a
collective and both ranks save at the same step; the agreement posts one CPU broadcast per
boundary and never touches the training's own process group; a job of several ranks
without a process group fails the command with that reason instead of rank 0 saving alone."""

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
# at, written to a file of its own.
JOB = f"""
import json, os, sys, time
import torch
import torch.distributed as dist
from opsboard_agent.reporter import Reporter

dist.init_process_group("gloo")
rank = dist.get_rank()
server = os.environ["STUB_URL"] if rank == 0 else None
reporter = Reporter.from_env(run="run-1", server=server, token="{TOKEN}" if server else None,
                             flush_interval=0.2)
saved = []
for step in range(1, 41):
    time.sleep(0.05)
    dist.all_reduce(torch.ones(1))  # the training's own collective, on the default group
    reporter.step(step)
    if reporter.checkpoint_requested(step):
        saved.append(step)
    if step == 5 and rank == 0:
        time.sleep(1.5)  # the long poll has the command by now
with open(os.path.join(sys.argv[1], f"rank-{{rank}}.json"), "w") as out:
    json.dump({{"saved": saved, "broadcasts": reporter.checkpoints.broadcasts}}, out)
reporter.close(drain_timeout=2)
dist.destroy_process_group()
"""


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def test_a_rank_without_a_reporter_still_agrees_and_both_save_at_one_step(stub, tmp_path):
    command_id = stub.issue("checkpoint", run="run-1")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=150,
        env={**os.environ, "PYTHONPATH": str(REPO), "OPSBOARD_NODE": "node-01",
             "STUB_URL": stub.url, "OPSBOARD_COMMANDS": "on"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert time.monotonic() - started < 120  # nobody waited for a rank that never came
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["saved"] == ranks[1]["saved"] and len(ranks[0]["saved"]) == 1
    assert ranks[0]["broadcasts"] == ranks[1]["broadcasts"] == 40  # one per boundary
    (ack,) = stub.acks_of(command_id)
    assert ack["state"] == "accepted" and ack["step"] == ranks[0]["saved"][0]


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
