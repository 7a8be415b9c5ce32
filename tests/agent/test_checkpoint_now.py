"""'Checkpoint now': the reporter picks an operator's command up, the ranks agree on the step,
every rank saves at it, the command is acked `accepted` with that step."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from opsboard_agent.reporter import Reporter
from tests.agent.command_stub import TOKEN, CommandStub
from tests.agent.conftest import REPO


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def reporter_for(stub: CommandStub, tmp_path, **kwargs) -> Reporter:
    return Reporter(
        run="run-1",
        server=stub.url,
        token=TOKEN,
        node="node-01",
        spool_dir=tmp_path / "spool",
        flush_interval=0.2,
        **{"commands": True, **kwargs},
    )


def test_the_reporter_checkpoints_once_at_the_next_step_and_acks_the_step(stub, tmp_path):
    reporter = reporter_for(stub, tmp_path)
    other_run = stub.issue("checkpoint", run="run-2")
    command_id = stub.issue("checkpoint", run="run-1")
    requested = []
    try:
        for step in range(200):
            reporter.step(step)
            if reporter.checkpoint_requested(step):
                requested.append(step)
            if requested and step > requested[0] + 5:
                break
            time.sleep(0.02)
        stub.wait_for(lambda: stub.states[command_id] == "accepted", 10, "accepted")
    finally:
        reporter.close(drain_timeout=2)
    assert len(requested) == 1 and reporter.checkpoint_step == requested[0]
    (ack,) = stub.acks_of(command_id)
    assert ack["step"] == requested[0] and str(requested[0]) in ack["detail"]
    assert stub.states[other_run] == "delivered" and not stub.acks_of(other_run)


def test_only_rank_0_polls_and_a_disabled_reporter_never_checkpoints(stub, tmp_path):
    stub.issue("checkpoint", run="run-1")
    other_rank = reporter_for(stub, tmp_path, rank=1, world_size=2)
    disabled = Reporter(run="run-1", server=None, token=None)
    try:
        time.sleep(1.0)
        assert other_rank.commands is None and not stub.polls
        # Without torch.distributed a lone rank 1 has nobody to agree with: never.
        assert not any(other_rank.checkpoint_requested(step) for step in range(5))
        assert not any(disabled.checkpoint_requested(step) for step in range(5))
    finally:
        other_rank.close(drain_timeout=0)


def test_a_local_request_checkpoints_at_the_next_boundary_of_the_sync_period(stub, tmp_path):
    reporter = reporter_for(stub, tmp_path, commands=False, checkpoint_sync_every=5)
    try:
        reporter.request_checkpoint()
        answers = [step for step in range(1, 12) if reporter.checkpoint_requested(step)]
    finally:
        reporter.close(drain_timeout=0)
    assert answers == [5] and not stub.polls


def train(stub: CommandStub, tmp_path, *extra: str, env: dict[str, str] | None = None):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO / "examples" / "ddp_train.py"),
        "--",
        "--server",
        stub.url,
        "--token-file",
        str(token_file),
        "--run",
        "run-1",
        "--spool-dir",
        str(tmp_path / "spool"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--check-every",
        "1000",
        *extra,
    ]
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OPSBOARD_NODE": "node-01",
            "OPSBOARD_COMMANDS": "on",
            **(env or {}),
        },
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_every_ddp_rank_saves_at_the_same_step_and_a_resume_continues_from_it(stub, tmp_path):
    command_id = stub.issue("checkpoint", run="run-1")
    train(stub, tmp_path, "--steps", "60", "--step-sleep", "0.05")
    (step_dir,) = (tmp_path / "ckpt" / "run-1" / "durable").iterdir()
    step = int(step_dir.name.removeprefix("step-"))
    assert sorted(p.name for p in step_dir.iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert stub.acks_of(command_id)[0]["step"] == step
    done = {
        (e["rank"], e["tier"])
        for e in stub.events("checkpoint")
        if e["state"] == "completed" and e["step"] == step
    }
    assert done == {(r, t) for r in (0, 1) for t in ("local", "durable")}
    assert all(e["step"] == step for e in stub.events("checkpoint"))

    stub.batches.clear()
    train(stub, tmp_path, "--steps", str(step + 4), env={"OPSBOARD_RESUME_FROM": str(step_dir)})
    reported = sorted((s["rank"], s["step"]) for b in stub.batches for s in b.get("steps", []))
    assert reported == [(r, s) for r in (0, 1) for s in range(step + 1, step + 4)]


def test_rank_0_polls_unless_turned_off(stub, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSBOARD_COMMANDS", "off")
    quiet = reporter_for(stub, tmp_path, commands=None)
    try:
        time.sleep(0.5)
        assert quiet.commands is None and not stub.polls
    finally:
        quiet.close(drain_timeout=0)
    monkeypatch.delenv("OPSBOARD_COMMANDS", raising=False)
    asked = reporter_for(stub, tmp_path / "asked", commands=None)
    try:
        deadline = time.monotonic() + 5
        while not stub.polls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asked.commands is not None and stub.polls
    finally:
        asked.close(drain_timeout=0)
