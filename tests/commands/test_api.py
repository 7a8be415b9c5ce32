"""The command API on the live stack: operators issue (201, then 200 for the same key),
viewers are refused, agents long-poll (delivery within a second of issue) and acknowledge,
launchers read the run's plan."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import Command
from tests.commands.conftest import checkpoint_event, client, issue

pytestmark = pytest.mark.usefixtures("live_stack")


def test_a_repeated_idempotency_key_answers_200_with_the_same_command(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        first = issue(operator, "key-1", kind="checkpoint", run="run-1", reason="before upgrade")
        again = issue(operator, "key-1", kind="checkpoint", run="run-1", reason="before upgrade")
    assert (first.status_code, again.status_code) == (201, 200), first.text
    assert first.json()["id"] == again.json()["id"]
    body = first.json()
    assert (body["kind"], body["run"], body["state"], body["issued_by"]) == (
        "checkpoint", "run-1", "issued", "olga"
    )  # fmt: skip
    assert [h["to_state"] for h in body["history"]] == ["issued"]
    assert Command.objects.count() == 1


def test_it_refuses_a_viewer_and_hides_foreign_clusters(live_stack, world):
    with client(live_stack, world.viewer_secret) as viewer:
        refused = issue(viewer, kind="stop", run="run-1")
    with client(live_stack, world.operator_secret) as operator:
        missing = issue(operator, kind="stop", run="run-of-someone-else")
        no_key = operator.post("/api/v1/commands", json={"kind": "stop", "run": "run-1"})
    assert refused.status_code == 403 and missing.status_code == 404
    assert no_key.status_code == 400
    assert not Command.objects.exists()
    ours = AuditEntry.objects.filter(cluster_id=world.cluster.pk)
    assert ours.filter(action="command.stop", outcome="denied").count() == 1


def test_arguments_are_bounded_like_ingest_fields_and_refused_naming_the_field(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        nul = issue(operator, kind="resume", run="run-1", args={"checkpoint": "/ckpt\x00"})
        unknown = issue(operator, kind="resume", run="run-1", args={"shell": "rm -rf /"})
        bad_node = issue(operator, kind="resume", run="run-1", args={"nodes": [".."]})
        nul_cluster = issue(operator, kind="checkpoint", run="run-1", cluster="a\x00b")
        nul_run = issue(operator, kind="checkpoint", run="run\x00-1")
    named = ((nul, "checkpoint"), (unknown, "shell"), (bad_node, "nodes"))
    named += ((nul_cluster, "cluster"), (nul_run, "run"))
    for answer, loc in named:
        assert answer.status_code == 400, answer.text
        assert loc in answer.json()["errors"][0]["loc"], answer.text
    assert not Command.objects.exists()


def test_a_held_long_poll_delivers_a_new_command_within_a_second(live_stack, world):
    answer = {}

    def poll():
        with client(live_stack, world.agent_secret) as agent:
            answer["response"] = agent.get(
                "/api/v1/commands", params={"node": "node-01", "wait": 20}
            )
            answer["at"] = time.monotonic()

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1.5)  # the poll is held
    with client(live_stack, world.operator_secret) as operator:
        issued_at = time.monotonic()
        created = issue(operator, kind="checkpoint", run="run-1")
    poller.join(30)
    assert created.status_code == 201
    commands = answer["response"].json()["commands"]
    assert [c["id"] for c in commands] == [created.json()["id"]]
    assert commands[0]["state"] == "delivered"
    assert answer["at"] - issued_at < 1.0


def test_an_empty_long_poll_answers_after_wait(live_stack, world):
    with client(live_stack, world.agent_secret) as agent:
        started = time.monotonic()
        response = agent.get("/api/v1/commands", params={"node": "node-01", "wait": 1})
    assert response.json() == {"commands": []}
    assert 0.9 < time.monotonic() - started < 5


def test_acks_move_the_command_forward_and_backwards_is_409(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="stop", run="run-1").json()["id"]
    ack = f"/api/v1/commands/{command_id}/ack"
    with client(live_stack, world.agent_secret) as agent:
        accepted = agent.post(ack, json={"state": "accepted"})
        repeated = agent.post(ack, json={"state": "accepted"})
        done = agent.post(ack, json={"state": "succeeded", "detail": "stopped"})
        backwards = agent.post(ack, json={"state": "accepted"})
    assert [r.status_code for r in (accepted, repeated, done, backwards)] == [200, 200, 200, 409]
    body = done.json()
    assert body["state"] == "succeeded" and body["result"]["message"] == "stopped"
    assert [h["to_state"] for h in body["history"]] == ["issued", "accepted", "succeeded"]
    with client(live_stack, world.operator_secret) as operator:
        listed = operator.get("/api/v1/commands", params={"run": "run-1", "state": "succeeded"})
        detail = operator.get(f"/api/v1/commands/{command_id}")
    assert [c["id"] for c in listed.json()["commands"]] == [command_id]
    assert detail.json()["state"] == "succeeded"


def test_another_clusters_agent_cannot_ack(live_stack, world):
    from apps.clusters.services import token_issue

    _, stranger = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}")
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="stop", run="run-1").json()["id"]
    with client(live_stack, stranger) as agent:
        response = agent.post(f"/api/v1/commands/{command_id}/ack", json={"state": "accepted"})
    assert response.status_code == 404
    assert Command.objects.get(pk=command_id).state == "issued"


def test_an_accepted_checkpoint_succeeds_once_every_saving_rank_is_durable(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="checkpoint", run="run-1").json()["id"]
    ack = f"/api/v1/commands/{command_id}/ack"
    for rank in range(4):
        checkpoint_event(
            world.run, world.node1, step=120, rank=rank, tier="durable", state="started"
        )
    for rank in range(3):
        checkpoint_event(
            world.run, world.node1, step=120, rank=rank, tier="durable", state="completed"
        )
    with client(live_stack, world.agent_secret) as agent:
        accepted = agent.post(ack, json={"state": "accepted", "step": 120})
        assert accepted.json()["state"] == "accepted"  # rank 3 has not finished
        checkpoint_event(
            world.run, world.node2, step=120, rank=3, tier="durable", state="completed"
        )
        # the periodic sweep (beat, every COMMANDS_SWEEP_INTERVAL) judges it now
        deadline = time.monotonic() + 20
        while (
            Command.objects.get(pk=command_id).state == "accepted" and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    assert Command.objects.get(pk=command_id).state == "succeeded"


def test_a_checkpoint_waits_for_ranks_whose_part_is_not_known_yet(live_stack, world):
    """Ranks 0-1's events are stored, ranks 2-3 reported the step but nothing after it yet:
    their checkpoint events may still be on the way, so the command stays accepted until
    they either report one (and it is judged with them) or move on to a later step."""
    from apps.commands.services import checkpoint_evaluate
    from tests.commands.conftest import serve

    serve(world.run, world.node1, step=130, ranks=range(0, 2))
    serve(world.run, world.node2, step=130, ranks=range(2, 4))
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="checkpoint", run="run-1").json()["id"]
    for rank in range(2):
        for state in ("started", "completed"):
            checkpoint_event(
                world.run, world.node1, step=130, rank=rank, tier="durable", state=state
            )
    with client(live_stack, world.agent_secret) as agent:
        accepted = agent.post(
            f"/api/v1/commands/{command_id}/ack", json={"state": "accepted", "step": 130}
        )
    assert accepted.json()["state"] == "accepted"
    command = Command.objects.get(pk=command_id)
    assert checkpoint_evaluate(command=command).state == "accepted"  # 2 and 3 unknown
    checkpoint_event(world.run, world.node2, step=130, rank=2, tier="durable", state="started")
    serve(world.run, world.node2, step=131, ranks=range(3, 4))  # rank 3 saves nothing
    assert checkpoint_evaluate(command=command).state == "accepted"  # rank 2 still saving
    checkpoint_event(world.run, world.node2, step=130, rank=2, tier="durable", state="completed")
    assert checkpoint_evaluate(command=command).state == "succeeded"


def test_a_failed_checkpoint_event_fails_the_command(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="checkpoint", run="run-1").json()["id"]
    checkpoint_event(world.run, world.node1, step=130, rank=1, tier="local", state="failed")
    with client(live_stack, world.agent_secret) as agent:
        response = agent.post(
            f"/api/v1/commands/{command_id}/ack", json={"state": "accepted", "step": 130}
        )
    assert response.json()["state"] == "failed"


def test_the_plan_names_the_durable_checkpoint_and_the_healthy_nodes(live_stack, world):
    # both nodes' ranks report it: one node's claim alone is not used (test_plan_quorum)
    checkpoint_event(world.run, world.node1, step=90, rank=0, tier="durable", state="completed")
    checkpoint_event(world.run, world.node2, step=90, rank=2, tier="durable", state="completed")
    checkpoint_event(world.run, world.node1, step=100, rank=0, tier="local", state="completed")
    Node.objects.filter(pk=world.node2.pk).update(state="cordoned")
    with client(live_stack, world.agent_secret) as agent:
        plan = agent.get("/api/v1/runs/run-1/plan")
        missing = agent.get("/api/v1/runs/no-such-run/plan")
    assert plan.json() == {
        "run": "run-1",
        "checkpoint": {"step": 90, "path": "/ckpt/step-90", "tier": "durable"},
        "nodes": ["node-01"],
        "skipped": [],
        "nodes_skipped": [{"node": "node-02", "state": "cordoned", "why": "cordoned"}],
    }
    assert missing.status_code == 404


def test_an_accepted_checkpoint_without_its_step_is_refused_naming_step(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        command_id = issue(operator, kind="checkpoint", run="run-1").json()["id"]
    with client(live_stack, world.agent_secret) as agent:
        refused = agent.post(f"/api/v1/commands/{command_id}/ack", json={"state": "accepted"})
        assert refused.status_code == 400
        assert refused.json()["errors"][0]["loc"] == "step"
        assert Command.objects.get(pk=command_id).state == "issued"
        with_step = {"state": "accepted", "step": 100}
        assert agent.post(f"/api/v1/commands/{command_id}/ack", json=with_step).is_success
