"""`supervise` carries out only what it still may: an expired command is not carried out, a
resume starts from a clean environment with the command's checkpoint and step, and no
resume starts once the supervisor is shutting down. A real supervisor around a real job,
against the loopback command stub."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
import uuid

import pytest

from launcher.procs import wait_until
from tests.agent.command_stub import CommandStub
from tests.agent.supervised import scan, start_supervisor

# Logs each start (pid, the resume environment, the job id) and each SIGTERM; with "exit"
# it leaves on SIGTERM, with "ignore" it outlives it.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    def write(**record):
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\\n")
    env = os.environ.get
    write(event="start", pid=os.getpid(), resume=env("OPSBOARD_RESUME_FROM"),
          step=env("OPSBOARD_RESUME_STEP"), nodes=env("OPSBOARD_NODES"),
          job=env("OPSBOARD_JOB_ID"))
    def on_term(*_):
        write(event="term", pid=os.getpid())
        if mode == "exit":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def supervise(stub, tmp_path, mode: str, *, grace: float = 1.5, env=None):
    (tmp_path / "child.py").write_text(CHILD)
    job = [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "log"), mode]
    mark = f"opsboard-mark-{uuid.uuid4().hex}"
    return start_supervisor(stub.url, tmp_path, job, mark=mark, grace=grace, env=env), mark


def records(tmp_path) -> list[dict]:
    path = tmp_path / "log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def starts(tmp_path) -> list[dict]:
    return [record for record in records(tmp_path) if record["event"] == "start"]


def finished(stub, command_id: str, what: str) -> str:
    stub.wait_for(lambda: stub.states[command_id] in ("succeeded", "failed"), 30, what)
    return stub.acks_of(command_id)[-1]["detail"]


def test_an_expired_command_is_failed_and_not_carried_out(stub, tmp_path, supervisors):
    supervisor, _ = supervise(stub, tmp_path, "exit")
    supervisors(supervisor)
    wait_until(lambda: starts(tmp_path), 20, "the job to start")
    stop = stub.issue("stop", run="run-1", expires_in=-1)
    assert "expired" in finished(stub, stop, "the expired stop")
    assert stub.states[stop] == "failed"
    assert [ack["state"] for ack in stub.acks_of(stop)] == ["failed"]  # never accepted
    time.sleep(1.0)
    assert [r["event"] for r in records(tmp_path)] == ["start"]  # no SIGTERM reached it

    live = stub.issue("stop", run="run-1")
    assert "stopped by SIGTERM" in finished(stub, live, "the live stop")
    resume = stub.issue("resume", run="run-1", checkpoint="/c/step-3", nodes=["a"], expires_in=-1)
    assert "expired" in finished(stub, resume, "the expired resume")
    assert stub.states[resume] == "failed"
    time.sleep(1.0)
    assert len(starts(tmp_path)) == 1


def test_a_resume_starts_from_a_clean_environment(stub, tmp_path, supervisors):
    stale = {"OPSBOARD_RESUME_FROM": "/stale", "OPSBOARD_RESUME_STEP": "7"}
    supervisor, _ = supervise(stub, tmp_path, "exit", env={**stale, "OPSBOARD_NODES": "z"})
    supervisors(supervisor)
    wait_until(lambda: starts(tmp_path), 20, "the job to start")
    # whoever started the supervisor set these for its first start
    assert starts(tmp_path)[0]["resume"] == "/stale" and starts(tmp_path)[0]["step"] == "7"

    def stop_and_resume(**args) -> dict:
        stop = stub.issue("stop", run="run-1")
        assert stub.states[stop] != "failed"
        finished(stub, stop, "the stop")
        count = len(starts(tmp_path))
        resume = stub.issue("resume", run="run-1", **args)
        detail = finished(stub, resume, "the resume")
        assert stub.states[resume] == "succeeded", detail
        wait_until(lambda: len(starts(tmp_path)) == count + 1, 20, "the job to start again")
        return starts(tmp_path)[-1]

    first = stop_and_resume(checkpoint={"path": "/x/step-9", "step": 9}, nodes=["c", "d"])
    assert (first["resume"], first["step"], first["nodes"]) == ("/x/step-9", "9", "c,d")
    second = stop_and_resume(checkpoint="/x/step-12", step=12, nodes=["c"])
    assert (second["resume"], second["step"], second["nodes"]) == ("/x/step-12", "12", "c")
    # from scratch: nothing of the previous resume, nor of the supervisor's own environment
    stub.set_plan("run-1", {"checkpoint": None, "nodes": []})
    scratch = stop_and_resume()
    assert (scratch["resume"], scratch["step"], scratch["nodes"]) == (None, None, "")
    assert len({start["job"] for start in starts(tmp_path)}) == 4  # each start a job of its own


@pytest.mark.timeout(120)
def test_no_resume_starts_once_the_supervisor_is_shutting_down(stub, tmp_path, supervisors):
    supervisor, mark = supervise(stub, tmp_path, "ignore", grace=3)
    supervisors(supervisor)
    wait_until(lambda: starts(tmp_path), 20, "the job to start")
    stop = stub.issue("stop", run="run-1")
    stub.wait_for(lambda: stub.states[stop] == "accepted", 30, "the stop under way")
    supervisor.send_signal(signal.SIGTERM)  # shutting down while the stop waits its grace
    resume = stub.issue("resume", run="run-1", checkpoint="/c/step-3", nodes=["a"])
    assert supervisor.wait(60) == 0
    assert stub.states[resume] != "succeeded"
    assert len(starts(tmp_path)) == 1
    assert scan(mark, exclude={supervisor.pid}) == []
