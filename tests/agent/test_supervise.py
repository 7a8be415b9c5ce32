"""`opsboard-agent supervise -- CMD…` as a real process around a real child, against a
loopback server speaking the agent protocol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.agent.command_stub import TOKEN, CommandStub
from tests.agent.conftest import REPO

# The job: logs each start (pid, resume env) and each SIGTERM to a file; with "ignore" it
# outlives SIGTERM (a job stuck in I/O), with "exit" it leaves at once, with "fail" it
# exits 3 by itself.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    def write(**record):
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\\n")
    write(event="start", pid=os.getpid(), resume=os.environ.get("OPSBOARD_RESUME_FROM"),
          nodes=os.environ.get("OPSBOARD_NODES"), run=os.environ.get("OPSBOARD_RUN"))
    def on_term(*_):
        write(event="term", pid=os.getpid())
        if mode == "exit":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    if mode == "fail":
        sys.exit(3)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def supervise(stub, tmp_path, mode: str, grace: float = 1.5, token: str = TOKEN):
    """`stub`: the loopback stub, or the live stack (anything with a `url`)."""
    (tmp_path / "token").write_text(token)
    (tmp_path / "child.py").write_text(CHILD)
    argv = [sys.executable, "-m", "opsboard_agent", "supervise", "--server", stub.url]
    argv += ["--token-file", str(tmp_path / "token"), "--node", "node-01", "--run", "run-1"]
    argv += ["--grace", str(grace), "--wait", "1", "--spool-dir", str(tmp_path / "spool")]
    argv += ["--", sys.executable, str(tmp_path / "child.py"), str(tmp_path / "log"), mode]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def records(tmp_path) -> list[dict]:
    path = tmp_path / "log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stopper():
    procs = []
    yield procs.append
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)


def test_stop_sends_sigterm_then_sigkill_after_the_grace(stub, tmp_path, stopper):
    supervisor = supervise(stub, tmp_path, "ignore", grace=1.5)
    stopper(supervisor)
    wait_until(lambda: records(tmp_path), 20, "the job to start")
    pid = records(tmp_path)[0]["pid"]
    command_id = stub.issue("stop", run="run-1")
    stub.wait_for(lambda: stub.states[command_id] == "succeeded", 30, "stop succeeded")
    succeeded = stub.acks[-1]
    # The ack of `accepted` is queued and may arrive after SIGTERM went out; the delivery
    # surely preceded it, so SIGKILL at SIGTERM + grace lands at least 1.5 s after it.
    assert succeeded[2] - stub.delivered_at[command_id] >= 1.5
    assert "killed after 1.5 s grace" in succeeded[1]["detail"]
    assert [r["event"] for r in records(tmp_path)] == ["start", "term"]
    assert not alive(pid)
    assert supervisor.poll() is None  # it stays, waiting for a resume


def test_resume_restarts_the_job_with_the_plan_and_reports_a_restart(stub, tmp_path, stopper):
    stub.set_plan(
        "run-1",
        {
            "checkpoint": {"step": 40, "path": "/ckpt/step-40", "tier": "durable"},
            "nodes": ["a", "b"],
        },
    )
    supervisor = supervise(stub, tmp_path, "exit")
    stopper(supervisor)
    wait_until(lambda: records(tmp_path), 20, "the job to start")
    stop = stub.issue("stop", run="run-1")
    stub.wait_for(lambda: stub.states[stop] == "succeeded", 30, "stop succeeded")
    assert "stopped by SIGTERM (exit 0)" in stub.acks_of(stop)[-1]["detail"]
    stub.redeliver = True  # a resume offered again must not start a second job
    resume = stub.issue("resume", run="run-1")
    stub.wait_for(lambda: stub.states[resume] == "succeeded", 30, "resume succeeded")
    stub.wait_for(lambda: stub.events("restart"), 20, "the restart event")
    time.sleep(2.5)  # a few more polls re-offer both commands
    starts = [r for r in records(tmp_path) if r["event"] == "start"]
    assert len(starts) == 2 and alive(starts[1]["pid"])
    assert starts[1]["resume"] == "/ckpt/step-40" and starts[1]["nodes"] == "a,b"
    assert starts[0]["resume"] is None and starts[1]["run"] == "run-1"
    (event,) = stub.events("restart")
    assert event["checkpoint"] == "/ckpt/step-40" and event["restart_count"] == 1
    assert stub.batches[0]["run"] == "run-1" and stub.batches[0]["node"] == "node-01"
    assert supervisor.poll() is None


def test_a_resume_names_its_own_checkpoint_and_nodes_and_fails_while_running(
    stub, tmp_path, stopper
):
    supervisor = supervise(stub, tmp_path, "exit")
    stopper(supervisor)
    wait_until(lambda: records(tmp_path), 20, "the job to start")
    early = stub.issue("resume", run="run-1", checkpoint="/x/step-9", nodes=["c"])
    stub.wait_for(lambda: stub.states[early] == "failed", 30, "resume refused")
    stub.issue("stop", run="run-1")
    wait_until(lambda: len(records(tmp_path)) == 2, 30, "the job to stop")
    resume = stub.issue("resume", run="run-1", checkpoint={"path": "/x/step-9"}, nodes=["c"])
    stub.wait_for(lambda: stub.states[resume] == "succeeded", 30, "resume succeeded")
    wait_until(lambda: len(records(tmp_path)) == 3, 20, "the job to start again")
    start = records(tmp_path)[-1]
    assert start["event"] == "start" and start["resume"] == "/x/step-9" and start["nodes"] == "c"
    assert "/api/v1/runs/run-1/plan" not in [r.path for r in stub.loopback.requests]


def test_the_supervisor_exits_with_the_job_status_and_stops_it_on_sigterm(stub, tmp_path, stopper):
    (tmp_path / "a").mkdir()
    assert supervise(stub, tmp_path / "a", "fail").wait(30) == 3
    supervisor = supervise(stub, tmp_path, "ignore", grace=0.5)
    stopper(supervisor)
    wait_until(lambda: records(tmp_path), 20, "the job to start")
    pid = records(tmp_path)[0]["pid"]
    supervisor.terminate()
    assert supervisor.wait(30) == 0
    assert not alive(pid) and records(tmp_path)[-1]["event"] == "term"


@pytest.mark.django_db(transaction=True)
@pytest.mark.stack
@pytest.mark.timeout(180)
def test_live_stop_and_resume_reach_the_job_and_end_succeeded(
    agent, agent_token, live_stack, tmp_path, stopper, django_user_model
):
    from apps.commands.models import Command
    from apps.commands.services import command_issue
    from apps.runs.models import Run, RunEvent

    token, secret = agent_token
    now = time.time()
    durable = {"ts": now, "kind": "checkpoint", "step": 40, "tier": "durable"}
    durable.update(state="completed", path="/ckpt/step-40", rank=0)
    batch = {"batch_id": uuid.uuid4().hex, "node": "node-01", "run": "run-1"}
    batch.update(steps=[{"ts": now, "rank": 0, "step": 40, "step_time": 0.5}], events=[durable])
    assert agent.post(batch).status_code == 202
    runs = Run.objects.filter(cluster=token.cluster, name="run-1")
    wait_until(runs.exists, 30, "the run")
    operator = django_user_model.objects.create_superuser("ops", password="x")

    def issue(kind: str) -> Command:
        command, _ = command_issue(
            user=operator,
            cluster=token.cluster,
            kind=kind,
            run=runs.get(),
            idempotency_key=uuid.uuid4().hex,
            reason="test",
        )
        return command

    def state(command: Command) -> str:
        return Command.objects.get(pk=command.pk).state

    supervisor = supervise(live_stack, tmp_path, "exit", token=secret)
    stopper(supervisor)
    wait_until(lambda: records(tmp_path), 20, "the job to start")
    stop = issue("stop")
    wait_until(lambda: state(stop) == "succeeded", 60, "stop succeeded")
    assert [r["event"] for r in records(tmp_path)] == ["start", "term"]
    resume = issue("resume")
    wait_until(lambda: state(resume) == "succeeded", 60, "resume succeeded")
    wait_until(lambda: len(records(tmp_path)) == 3, 20, "the job to start again")
    assert records(tmp_path)[-1]["resume"] == "/ckpt/step-40"
    restarts = RunEvent.objects.filter(run__in=runs, kind="restart")
    wait_until(restarts.exists, 30, "the restart event")
