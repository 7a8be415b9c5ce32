"""Node-bound agent tokens on the live stack: a token issued for some nodes posts batches,
polls (on the WSGI and the ASGI server) and acknowledges only as them, answered 403 naming
the field otherwise; cluster-wide tokens act for every node as before."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from apps.audit.models import AuditEntry
from apps.clusters.models import AgentToken
from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from launcher.procs import ROOT
from tests.commands.conftest import client, issue, world  # noqa: F401
from tests.commands.test_longpoll import asgi
from tests.conftest import make_batch
from tests.stackproc import database_url

pytestmark = pytest.mark.usefixtures("live_stack")


@pytest.fixture
def node_token(world):  # noqa: F811
    """A token of the world's cluster for node-01 only (and a pattern naming no other)."""
    token, secret = token_issue(
        cluster_name=world.cluster.name, name="gpu-01-agent", nodes=["node-01", "gpu-[001-004]"]
    )
    return token, secret


def test_it_posts_batches_only_for_its_own_nodes(live_stack, world, node_token):  # noqa: F811
    token, secret = node_token
    with client(live_stack, secret) as agent:
        own = agent.post("/api/v1/ingest", json=make_batch(node="node-01"))
        by_pattern = agent.post("/api/v1/ingest", json=make_batch(node="gpu-003"))
        foreign_batch = make_batch(node="node-02")
        foreign = agent.post("/api/v1/ingest", json=foreign_batch)
    assert own.status_code == 202 and by_pattern.status_code == 202
    assert foreign.status_code == 403
    assert foreign.json()["errors"][0]["loc"] == "node"
    # refused before the durable accept: nothing of it is kept
    assert not InboxBatch.objects.filter(batch_id=foreign_batch["batch_id"]).exists()
    # a cluster-wide token still posts for any node
    with client(live_stack, world.agent_secret) as agent:
        assert agent.post("/api/v1/ingest", json=make_batch(node="node-02")).status_code == 202


def test_it_polls_only_as_its_own_nodes_on_either_server(live_stack, world, node_token):  # noqa: F811
    _, secret = node_token
    with client(live_stack, secret) as wsgi, asgi(live_stack, secret) as held:
        for http in (wsgi, held):
            assert http.get("/api/v1/commands", params={"node": "node-01"}).status_code == 200
            foreign = http.get("/api/v1/commands", params={"node": "node-02", "wait": 1})
            assert foreign.status_code == 403, http.base_url
            assert foreign.json()["errors"][0]["loc"] == "node"


def test_it_acknowledges_only_commands_handed_to_its_nodes(live_stack, world, node_token):  # noqa: F811
    _, secret = node_token
    with client(live_stack, world.operator_secret) as operator:
        mine = issue(operator, kind="checkpoint", run="run-1").json()["id"]
    with client(live_stack, secret) as agent:
        assert [c["id"] for c in agent.get("/api/v1/commands", params={"node": "node-01"}).json()[
            "commands"
        ]] == [mine]  # fmt: skip
        accepted = {"state": "accepted", "step": 100}
        assert agent.post(f"/api/v1/commands/{mine}/ack", json=accepted).is_success
    with client(live_stack, world.operator_secret) as operator:
        theirs = issue(operator, kind="stop", run="run-1").json()
    with client(live_stack, world.agent_secret) as other_node:
        handed = other_node.get("/api/v1/commands", params={"node": "node-02"}).json()["commands"]
    assert [c["id"] for c in handed] == [theirs["id"]]
    with client(live_stack, secret) as agent:
        refused = agent.post(f"/api/v1/commands/{theirs['id']}/ack", json={"state": "succeeded"})
    assert refused.status_code == 403
    assert refused.json()["errors"][0]["loc"] == "command_id"
    denied = AuditEntry.objects.get(target=f"command:{theirs['id']}", outcome="denied")
    assert denied.action == "command.ack" and "gpu-01-agent" in denied.actor_name
    assert denied.detail["agent_token"]["nodes"] == ["node-01", "gpu-[001-004]"]
    with client(live_stack, world.operator_secret) as operator:
        assert operator.get(f"/api/v1/commands/{theirs['id']}").json()["state"] == "delivered"


def test_issue_token_binds_a_token_to_nodes_and_refuses_a_bad_pattern(world):  # noqa: F811
    name = f"c-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "manage.py", "issue_token", name, "--name", "rack-1"]
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict)}
    done = subprocess.run(
        [*command, "--node", "gpu-[001-128]", "--node", "login-1"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    token = AgentToken.objects.get(cluster__name=name)
    assert token.nodes == ["gpu-[001-128]", "login-1"] and not token.is_cluster_wide
    assert token.prefix == done.stdout.strip()[:10]
    assert "gpu-[001-128], login-1" in done.stderr
    assert token.acts_for("gpu-064") and not token.acts_for("gpu-129")
    bad = subprocess.run(
        [*command, "--node", "gpu-[9-1]"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "--node" in bad.stderr and "backwards" in bad.stderr
    assert AgentToken.objects.filter(cluster__name=name).count() == 1
