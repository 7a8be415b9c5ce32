"""Runs that end: a run_end event finishes (or fails) the run everywhere, stops its detectors
and resolves its alerts; a run whose steps just stop is a `hang`; a node heard only from
inside a training job follows its run and never raises `heartbeat`."""

from __future__ import annotations

import time
import uuid

import pytest

from apps.alerts.models import ClusterDetectorConfig
from apps.clusters.models import Node
from launcher.procs import wait_until
from tests.conftest import make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

# Small limits so that a stall shows within seconds: hang after 3 s, heartbeat after 3 s.
FAST = {"hang_min_s": 3, "hang_factor": 2, "heartbeat_min_s": 3, "heartbeat_factor": 1}


def steps_batch(run: str, node: str, step: int, ranks: int = 2) -> dict:
    """A batch from inside a training job: steps only, with its run (no node agent)."""
    return {
        "batch_id": uuid.uuid4().hex,
        "node": node,
        "run": run,
        "steps": [
            {"ts": time.time(), "rank": rank, "step": step, "step_time": 0.3}
            for rank in range(ranks)
        ],
    }


def run_end(run: str, node: str, state: str, **fields) -> dict:
    event = {"ts": time.time(), "kind": "run_end", "state": state, **fields}
    return {"batch_id": uuid.uuid4().hex, "node": node, "run": run, "events": [event]}


def train(agent, run: str, node: str, steps: int = 6) -> None:
    for step in range(steps):
        assert agent.post(steps_batch(run, node, step)).status_code == 202
        time.sleep(0.3)


def alerts(agent, **params) -> list[dict]:
    return agent.get("/api/v1/alerts", **params).json()["alerts"]


def run_state(agent, run: str) -> str | None:
    response = agent.get(f"/api/v1/runs/{run}")
    return response.json()["state"] if response.status_code == 200 else None


def test_a_run_whose_steps_stop_hangs_and_its_end_resolves_it_with_no_heartbeat(agent, agent_token):
    ClusterDetectorConfig.objects.create(cluster=agent_token[0].cluster, overrides=FAST)
    train(agent, "job-a", "trainer-1")
    [hang] = wait_until(
        lambda: [a for a in alerts(agent, run="job-a") if a["kind"] == "hang"], 40, "the hang"
    )
    assert hang["state"] == "firing"
    assert not Node.objects.get(name="trainer-1").has_agent
    assert not alerts(agent, node="trainer-1"), "no heartbeat for a node without an agent"

    assert agent.post(run_end("job-a", "trainer-1", "finished", rank=0)).status_code == 202
    wait_until(lambda: run_state(agent, "job-a") == "finished", 20, "the run to finish")
    # at the next pass, with no hold-down: the run is over
    wait_until(
        lambda: [a["state"] for a in alerts(agent, run="job-a")] == ["resolved"],
        20,
        "the hang alert to resolve",
    )
    time.sleep(2 * FAST["heartbeat_min_s"])  # the node is silent: idle, not missing
    assert [a["kind"] for a in alerts(agent, node="trainer-1")] == []
    assert [a["state"] for a in alerts(agent, run="job-a")] == ["resolved"]


def test_an_ended_run_is_not_evaluated_and_its_node_is_idle(agent, agent_token):
    ClusterDetectorConfig.objects.create(cluster=agent_token[0].cluster, overrides=FAST)
    train(agent, "job-b", "trainer-2", steps=4)
    assert agent.post(run_end("job-b", "trainer-2", "finished")).status_code == 202
    wait_until(lambda: run_state(agent, "job-b") == "finished", 20, "the run to finish")
    time.sleep(3 * FAST["hang_min_s"])  # well past both limits
    assert alerts(agent, run="job-b") == [] and alerts(agent, node="trainer-2") == []


def test_a_node_agents_silence_is_still_a_heartbeat(agent, agent_token):
    ClusterDetectorConfig.objects.create(cluster=agent_token[0].cluster, overrides=FAST)
    for _ in range(3):
        assert agent.post(make_batch(node="agent-1", samples=1)).status_code == 202
        time.sleep(0.5)
    assert Node.objects.get(name="agent-1").has_agent
    wait_until(
        lambda: [a for a in alerts(agent, node="agent-1") if a["kind"] == "heartbeat"],
        30,
        "the heartbeat alert",
    )


def test_failed_wins_over_finished_and_a_restart_runs_again(agent, agent_token):
    train(agent, "job-c", "trainer-3", steps=2)
    assert agent.post(run_end("job-c", "trainer-3", "failed", rank=1, message="NCCL timeout"))
    assert agent.post(run_end("job-c", "trainer-3", "finished", rank=0)).status_code == 202
    wait_until(lambda: run_state(agent, "job-c") == "failed", 20, "the run to fail")
    restart = {"ts": time.time() + 1, "kind": "restart", "rank": 0}
    body = {"batch_id": uuid.uuid4().hex, "node": "trainer-3", "run": "job-c", "events": [restart]}
    assert agent.post(body).status_code == 202
    wait_until(lambda: run_state(agent, "job-c") == "running", 20, "the restarted run")


@pytest.mark.parametrize(
    ("batch", "loc"),
    [
        ({"events": [{"ts": 0, "kind": "run_end", "state": "finished"}]}, "run"),
        ({"run": "r", "events": [{"ts": 0, "kind": "run_end", "state": "completed"}]}, "events"),
        ({"run": "r", "events": [{"ts": 0, "kind": "run_end"}]}, "events"),
    ],
)
def test_a_run_end_needs_its_run_and_a_final_state(agent, batch, loc):
    for event in batch["events"]:
        event["ts"] = time.time()
    response = agent.post({"batch_id": uuid.uuid4().hex, "node": "n", **batch})
    assert response.status_code == 400
    assert any(error["loc"].startswith(loc) for error in response.json()["errors"])


def test_the_openapi_schema_lists_run_end(agent):
    schema = agent.http.get("/api/v1/openapi.json").json()
    kinds = schema["components"]["schemas"]["Event"]["properties"]["kind"]["enum"]
    assert "run_end" in kinds
