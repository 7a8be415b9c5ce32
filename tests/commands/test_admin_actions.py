"""The Django admin's node and run actions issue commands through the API's service: the
admin user is the actor, the cluster role is checked (a refusal is audited), the scheduler
hook runs (in the live stack's worker); stop and drain ask for a reason and the names typed
again; a node's state is not editable in the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from apps.access.services import role_grant
from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import ClusterHooks, Command
from tests.commands.conftest import settled

NODES = "/admin/clusters/node/"
RUNS = "/admin/runs/run/"


def admin_client(user) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.fixture
def root(world):
    return admin_client(get_user_model().objects.create_superuser("root", password="pw-12345-x"))


def staff(username: str, *models: str):
    user = get_user_model().objects.create_user(username, password="pw-12345-x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=models))
    return user


def act(client: Client, changelist: str, action: str, objects, **fields):
    """The action on the objects: the confirmation page, then (with `fields`) its answer."""
    selected = {"action": action, "_selected_action": [obj.pk for obj in objects]}
    page = client.post(changelist, selected)
    assert page.status_code == 200, page.content[:500]
    if not fields:
        return page
    token = page.context["form"].initial["token"]
    return client.post(changelist, {**selected, "apply": "yes", "token": token, **fields})


def messages_of(response) -> list[str]:
    return [str(message) for message in response.wsgi_request._messages]


def test_cordon_from_the_admin_goes_through_the_service(live_stack, world, root, tmp_path):
    record = tmp_path / "kubectl.args"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\n')
    kubectl.chmod(0o755)
    ClusterHooks.objects.create(
        cluster=world.cluster, cordon_argv=[str(kubectl), "cordon", "{node}"]
    )
    page = act(root, NODES, "cordon", [world.node1])
    assert b"Cordon the selected nodes" in page.content and b"node-01" in page.content
    assert Node.objects.get(pk=world.node1.pk).state == "active"  # not before confirming
    done = act(root, NODES, "cordon", [world.node1], reason="fan failure")
    assert done.status_code == 302
    settled(world.cluster)
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason, node.cordoned_by.username) == (
        "cordoned", "fan failure", "root"
    )  # fmt: skip
    assert record.read_text() == "cordon node-01\n"
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert (entry.actor_name, entry.actor_kind, entry.outcome) == ("root", "user", "succeeded")
    assert entry.client_ip == "127.0.0.1" and entry.request_id
    command = Command.objects.get(kind="cordon")
    assert (command.state, command.issued_by.username) == ("succeeded", "root")


def test_uncordon_from_the_admin(live_stack, world, root):
    act(root, NODES, "cordon", [world.node1, world.node2], reason="rack move")
    settled(world.cluster)
    assert set(Node.objects.values_list("state", flat=True)) == {"cordoned"}
    act(root, NODES, "uncordon", [world.node2], reason="")
    settled(world.cluster)
    assert Node.objects.get(pk=world.node2.pk).state == "active"
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"


def test_staff_without_the_operator_role_are_refused_and_audited(world):
    viewer = staff("vera", "view_node")
    role_grant(user=viewer, cluster=world.cluster, role="viewer")
    done = act(admin_client(viewer), NODES, "cordon", [world.node1], reason="let me")
    assert done.status_code == 302
    assert Node.objects.get(pk=world.node1.pk).state == "active"
    assert not Command.objects.exists()
    entry = AuditEntry.objects.get(action="command.cordon", cluster_id=world.cluster.pk)
    assert (entry.actor_name, entry.outcome, entry.target) == ("vera", "denied", "node:node-01")
    assert any("may not operate" in text for text in messages_of(done))


def test_staff_see_only_the_nodes_of_their_clusters(world):
    stranger = staff("sam", "view_node")
    listing = admin_client(stranger).get(NODES)
    assert listing.status_code == 200 and b"node-01" not in listing.content


def test_drain_asks_for_a_reason_and_the_names_typed_again(live_stack, world, root):
    refused = act(root, NODES, "drain", [world.node1], reason="", confirm="node-01")
    assert refused.status_code == 200 and refused.context["form"].errors["reason"]
    mistyped = act(root, NODES, "drain", [world.node1], reason="XID 79", confirm="node-1")
    assert mistyped.context["form"].errors["confirm"]
    assert not Command.objects.exists()
    done = act(root, NODES, "drain", [world.node1], reason="XID 79", confirm="node-01")
    assert done.status_code == 302
    settled(world.cluster)
    drain = Command.objects.get(kind="drain")
    assert (drain.state, drain.reason) == ("accepted", "XID 79")
    assert Node.objects.get(pk=world.node1.pk).state == "draining"


def test_run_actions_issue_run_commands(world, root):
    act(root, RUNS, "checkpoint", [world.run], reason="before the upgrade")
    refused = act(root, RUNS, "stop", [world.run], reason="upgrade", confirm="run-2")
    assert refused.status_code == 200
    act(root, RUNS, "stop", [world.run], reason="upgrade", confirm="run-1")
    act(root, RUNS, "resume", [world.run], reason="")
    commands = {c.kind: c for c in Command.objects.all()}
    assert set(commands) == {"checkpoint", "stop", "resume"}
    assert all(c.run == world.run and c.issued_by.username == "root" for c in commands.values())
    assert commands["resume"].args["nodes"] == ["node-01", "node-02"]  # from the plan
    assert commands["stop"].reason == "upgrade"


def test_a_repeated_confirmation_issues_one_command(world, root):
    selected = {"action": "checkpoint", "_selected_action": [world.run.pk]}
    token = root.post(RUNS, selected).context["form"].initial["token"]
    for _ in range(2):
        root.post(RUNS, {**selected, "apply": "yes", "token": token, "reason": "x"})
    assert Command.objects.filter(kind="checkpoint").count() == 1


def test_the_node_state_is_read_only_in_the_admin(world, root):
    url = f"{NODES}{world.node1.pk}/change/"
    page = root.get(url)
    assert page.status_code == 200
    assert b'name="state"' not in page.content and b'name="cordon_reason"' not in page.content
    form = {"cluster": world.cluster.pk, "name": "node-01", "info": "{}", "has_agent": "on"}
    saved = root.post(url, {**form, "state": "cordoned", "cordon_reason": "sneaky"})
    assert saved.status_code == 302  # the form was saved: only the read-only fields were not
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason) == ("active", "")
