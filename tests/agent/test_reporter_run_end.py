"""The reporter ends its run: close() sends run_end `finished`; a training script that dies
on an uncaught exception without closing sends `failed` from its atexit hook (live stack)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from apps.runs.models import Run
from launcher.procs import ROOT, wait_until
from opsboard_agent.reporter import Reporter

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def run_state(agent, run: str) -> str | None:
    response = agent.get(f"/api/v1/runs/{run}")
    return response.json()["state"] if response.status_code == 200 else None


def test_close_ends_the_run_as_finished(agent, agent_token, live_stack, tmp_path):
    reporter = Reporter(
        run="rep-ok",
        server=live_stack.url,
        token=agent_token[1],
        node="rep-node",
        spool_dir=tmp_path,
        flush_interval=0.2,
    )
    for step in range(3):
        reporter.step(step, step_time=0.1)
    wait_until(lambda: run_state(agent, "rep-ok") == "running", 30, "the running run")
    reporter.close(drain_timeout=20)
    wait_until(lambda: run_state(agent, "rep-ok") == "finished", 30, "the finished run")


def test_a_script_that_dies_on_an_exception_ends_its_run_as_failed(
    agent, agent_token, live_stack, tmp_path
):
    script = textwrap.dedent(
        f"""
        from opsboard_agent.reporter import Reporter
        reporter = Reporter(run="rep-crash", server={live_stack.url!r}, token={agent_token[1]!r},
                            node="rep-node", rank=2, spool_dir={str(tmp_path)!r},
                            flush_interval=0.2)
        for step in range(3):
            reporter.step(step, step_time=0.1)
        raise RuntimeError("loss went NaN at step 3")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "RuntimeError" in done.stderr
    wait_until(lambda: run_state(agent, "rep-crash") == "failed", 30, "the failed run")
    run = Run.objects.get(name="rep-crash")
    assert run.end_message == "RuntimeError: loss went NaN at step 3"
    assert run.ended_at is not None and run.ended_at >= run.last_step_at
