"""Idempotency keys: the actor's (user or token) in the cluster, bound to the request (the
same key with another kind, target or args is 422), expiring after
COMMANDS_IDEMPOTENCY_TTL_S; the system's keys live where no request can write."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.services import role_grant, user_token_issue
from apps.audit.models import AuditEntry
from apps.commands.models import Command
from apps.commands.services import command_issue
from tests.commands.conftest import World


def api(secret: str, key: str, **body):
    return Client().post(
        "/api/v1/commands",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}", "Idempotency-Key": key},
    )


def second_operator(world: World) -> str:
    """A token of another operator of the world's cluster."""
    other = get_user_model().objects.create_user(f"otto-{uuid.uuid4().hex[:6]}")
    role_grant(user=other, cluster=world.cluster, role="operator")
    return user_token_issue(user=other)[1]


def test_the_same_key_with_another_request_is_422_and_audited(world):
    key = uuid.uuid4().hex
    first = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    same = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    other_kind = api(world.operator_secret, key, kind="stop", run="run-1", reason="x")
    other_target = api(world.operator_secret, key, kind="cordon", node="node-01")
    other_args = api(world.operator_secret, key, kind="checkpoint", run="run-1",
                     args={"ranks": [0, 1]})  # fmt: skip
    assert (first.status_code, same.status_code) == (201, 200), first.content
    assert same.json()["id"] == first.json()["id"]
    for refused in (other_kind, other_target, other_args):
        assert refused.status_code == 422, refused.content
        [error] = refused.json()["errors"]
        assert error["loc"] == "Idempotency-Key" and "another request" in error["msg"]
    assert Command.objects.filter(cluster=world.cluster).count() == 1
    invalid = AuditEntry.objects.filter(cluster_id=world.cluster.pk, outcome="invalid")
    assert sorted(invalid.values_list("action", flat=True)) == [
        "command.checkpoint", "command.cordon", "command.stop"
    ]  # fmt: skip
    assert {entry.detail["loc"] for entry in invalid} == {"Idempotency-Key"}
    assert {entry.actor_name for entry in invalid} == {"olga"}


def test_a_pages_form_token_posted_to_another_kind_is_422(world):
    page = Client()
    page.force_login(world.operator)
    base = f"/clusters/{world.cluster.name}/runs/run-1/commands"
    token = str(uuid.uuid4())
    first = page.post(f"{base}/checkpoint", {"token": token})
    other = page.post(f"{base}/stop", {"token": token, "reason": "x", "confirm": "run-1"})
    assert (first.status_code, other.status_code) == (302, 422)
    assert "another request" in other.content.decode()
    assert list(Command.objects.values_list("kind", flat=True)) == ["checkpoint"]


def test_another_actors_same_key_makes_a_new_command(world):
    key = uuid.uuid4().hex
    mine = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    theirs = api(second_operator(world), key, kind="checkpoint", run="run-1")
    assert (mine.status_code, theirs.status_code) == (201, 201), theirs.content
    assert mine.json()["id"] != theirs.json()["id"]
    assert theirs.json()["issued_by"] != "olga"
    # a person with the same key in the pages (a session, not the token) is another actor
    session = command_issue(
        user=world.operator, cluster=world.cluster, kind="checkpoint", run=world.run,
        idempotency_key=key,
    )  # fmt: skip
    assert session[1] and str(session[0].pk) not in (mine.json()["id"], theirs.json()["id"])


def test_an_expired_key_names_a_new_command(world):
    key = uuid.uuid4().hex
    first = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    ttl = timedelta(seconds=settings.COMMANDS_IDEMPOTENCY_TTL_S)
    assert ttl == timedelta(hours=24)
    old = Command.objects.get(pk=first.json()["id"])
    Command.objects.filter(pk=old.pk).update(issued_at=old.issued_at - ttl)
    # after expiry the key is free: another request with it is a new command, not a 422
    again = api(world.operator_secret, key, kind="stop", run="run-1", reason="after a day")
    assert again.status_code == 201, again.content
    assert again.json()["id"] != first.json()["id"] and again.json()["kind"] == "stop"
    repeat = api(world.operator_secret, key, kind="stop", run="run-1", reason="after a day")
    assert (repeat.status_code, repeat.json()["id"]) == (200, again.json()["id"])
    assert not Command.objects.get(pk=old.pk).idempotency_live


def test_a_key_younger_than_the_ttl_still_names_its_command(world):
    key = uuid.uuid4().hex
    first = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    old = Command.objects.get(pk=first.json()["id"])
    almost = timedelta(seconds=settings.COMMANDS_IDEMPOTENCY_TTL_S - 60)
    Command.objects.filter(pk=old.pk).update(issued_at=old.issued_at - almost)
    again = api(world.operator_secret, key, kind="checkpoint", run="run-1")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])


@pytest.mark.parametrize("key", ["policy:alert:7", "drain:1:checkpoint:1"])
def test_a_request_cannot_reach_a_system_key(world, key):
    system, created = command_issue(
        user=None, actor_kind="policy", actor_name="drain", cluster=world.cluster,
        kind="checkpoint", run=world.run, idempotency_key=key,
    )  # fmt: skip
    # the very key, and the very request: still the person's own command
    asked = api(world.operator_secret, key, kind="checkpoint", run="run-1", args={})
    assert created and asked.status_code == 201, asked.content
    assert asked.json()["id"] != str(system.pk) and asked.json()["issued_by"] == "olga"
    mine = Command.objects.get(pk=asked.json()["id"])
    assert (mine.idempotency_scope, system.idempotency_scope) == (
        f"token:{mine_token(world)}", "system"
    )  # fmt: skip
    # and the system still finds its own command under its key, however old
    Command.objects.filter(pk=system.pk).update(issued_at=system.issued_at - timedelta(days=30))
    found, created_again = command_issue(
        user=None, actor_kind="policy", actor_name="drain", cluster=world.cluster,
        kind="checkpoint", run=world.run, idempotency_key=key,
    )  # fmt: skip
    assert (found.pk, created_again) == (system.pk, False)


def mine_token(world: World) -> int:
    from apps.access.models import UserToken

    return UserToken.objects.get(user=world.operator).pk


def test_the_openapi_schema_documents_the_422():
    schema = Client().get("/api/v1/openapi.json").json()
    responses = schema["paths"]["/api/v1/commands"]["post"]["responses"]
    assert "422" in responses and "Idempotency-Key" in str(
        schema["paths"]["/api/v1/commands"]["post"]
    )
