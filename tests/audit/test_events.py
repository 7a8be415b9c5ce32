"""What else lands in the audit log, each with its actor: attempts answered 404 for a
cluster the user cannot see, invalid commands, agent token issue and revoke, the admin's
adds, changes and deletes, expiries, agents acting (named by their token); the audit page and
API show every kind."""

import io
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from apps.access.services import user_token_issue
from apps.alerts.models import Alert
from apps.audit.models import AuditEntry
from apps.clusters.models import AgentToken, Cluster, Node
from apps.clusters.services import token_issue
from apps.commands.models import Command
from apps.commands.services import command_issue, commands_sweep
from apps.runs.models import Run
from tests.access.conftest import client_of, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha(clusters):
    return Cluster.objects.get(name="alpha")


@pytest.fixture
def beta(clusters):
    return Cluster.objects.get(name="beta")


@pytest.fixture
def olga(alpha, beta):
    """An operator of alpha who holds no role in beta."""
    return user_with("olga", alpha="operator")


@pytest.fixture
def root():
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-12-x-y"))
    return client


def entries(**filters):
    return AuditEntry.objects.filter(**filters).order_by("id")


def post_command(secret: str, **body):
    return Client().post(
        "/api/v1/commands",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}", "Idempotency-Key": uuid.uuid4().hex},
    )


def test_a_command_for_a_hidden_cluster_is_404_and_audited_in_that_cluster(olga, beta):
    Node.objects.create(cluster=beta, name="secret-node")
    secret = user_token_issue(user=olga)[1]
    by_name = post_command(secret, kind="cordon", node="secret-node")
    by_cluster = post_command(secret, kind="stop", run="run-1", cluster="beta", reason="x")
    page = client_of(olga).post("/clusters/beta/nodes/node-00/commands/drain", {"reason": "x"})
    assert (by_name.status_code, by_cluster.status_code, page.status_code) == (404, 404, 404)
    logged = entries(cluster_id=beta.pk, outcome="denied")
    assert list(logged.values_list("action", "target", "actor_name", "actor_kind")) == [
        ("command.cordon", "node:secret-node", "olga", "token"),
        ("command.stop", "run:run-1", "olga", "token"),
        ("command.drain", "node:node-00", "olga", "user"),
    ]
    assert {entry.detail["answered"] for entry in logged} == {404}
    assert not Command.objects.exists()


def test_acknowledging_a_hidden_clusters_alert_is_404_and_audited(olga, beta):
    now = timezone.now()
    alert = Alert.objects.create(cluster=beta, kind="ecc", subject="node-00", severity="critical",
                                 summary="x", opened_at=now, last_seen_at=now)  # fmt: skip
    olga_client = client_of(olga)
    assert (
        olga_client.post(f"/api/v1/alerts/{alert.pk}/ack", {}, "application/json").status_code
        == 404
    )
    assert olga_client.post(f"/alerts/{alert.pk}/ack", {"note": "mine"}).status_code == 404
    logged = entries(target=f"alert:{alert.pk}")
    assert [(e.cluster_id, e.outcome, e.actor_name) for e in logged] == [
        (beta.pk, "denied", "olga"), (beta.pk, "denied", "olga")
    ]  # fmt: skip
    assert Alert.objects.get(pk=alert.pk).state == "firing"


def test_an_invalid_command_is_audited_as_invalid(olga, alpha):
    secret = user_token_issue(user=olga)[1]
    answer = post_command(secret, kind="cordon", run="run-1")  # cordon names a node
    assert answer.status_code == 400 and answer.json()["errors"][0]["loc"] == "node"
    [entry] = entries(cluster_id=alpha.pk, outcome="invalid")
    assert (entry.action, entry.actor_name, entry.actor_kind, entry.target) == (
        "command.cordon", "olga", "token", "run:run-1"
    )  # fmt: skip
    assert entry.detail["loc"] == "node"


def test_commands_refused_by_the_api_and_the_pages_own_checks_are_audited(olga, alpha):
    secret = user_token_issue(user=olga)[1]
    request_id = uuid.uuid4().hex
    no_target = Client().post(
        "/api/v1/commands",
        {"kind": "stop", "reason": "x"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}", "Idempotency-Key": "k",
                 "X-Request-ID": request_id},
    )  # fmt: skip
    unconfirmed = client_of(olga).post(
        "/clusters/alpha/runs/run-1/commands/stop",
        {"token": str(uuid.uuid4()), "reason": "x", "confirm": "not-the-name"},
    )
    assert (no_target.status_code, unconfirmed.status_code) == (400, 400)
    [api] = entries(request_id=request_id)
    assert (api.action, api.outcome, api.actor_kind, api.cluster_id, api.detail["loc"]) == (
        "command.stop", "invalid", "token", None, "run"
    )  # fmt: skip
    [page] = entries(cluster_id=alpha.pk, outcome="invalid")
    assert (page.action, page.actor_name, page.target, page.detail["loc"]) == (
        "command.stop", "olga", "run:run-1", "confirm"
    )  # fmt: skip
    assert not Command.objects.exists()


def test_agent_tokens_issued_and_revoked_are_audited_with_their_actor(alpha, root):
    out = io.StringIO()
    call_command("issue_token", "alpha", "--name", "rack-7", stdout=out, stderr=io.StringIO())
    token = AgentToken.objects.get(cluster=alpha, name="rack-7")
    [issued] = entries(action="agent_token.issue", target=f"agent_token:{token.pk}")
    assert (issued.actor_name, issued.cluster_id, issued.outcome) == (
        "manage.py", alpha.pk, "succeeded"
    )  # fmt: skip
    assert issued.detail["agent_token"] == {"id": token.pk, "name": "rack-7",
                                            "prefix": token.prefix, "nodes": []}  # fmt: skip
    assert out.getvalue().strip() not in str(issued.detail)  # never the secret
    revoked = root.post("/admin/clusters/agenttoken/",
                        {"action": "revoke", "_selected_action": [token.pk]})  # fmt: skip
    assert revoked.status_code == 302
    [entry] = entries(action="agent_token.revoke", target=f"agent_token:{token.pk}")
    assert (entry.actor_name, entry.actor_kind, entry.cluster_id) == ("root", "user", alpha.pk)
    assert entry.client_ip == "127.0.0.1"


def test_admin_adds_changes_and_deletes_are_audited(alpha, beta, root):
    since = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    added = root.post("/admin/clusters/cluster/add/", {"name": "gamma"})
    changed = root.post(f"/admin/clusters/cluster/{alpha.pk}/change/", {"name": "alpha-2"})
    gone = root.post(f"/admin/clusters/cluster/{beta.pk}/delete/", {"post": "yes"})
    runs = list(Run.objects.filter(cluster=alpha).values_list("pk", flat=True))
    bulk = root.post("/admin/runs/run/", {"action": "delete_selected", "post": "yes",
                                          "_selected_action": runs})  # fmt: skip
    assert [r.status_code for r in (added, changed, gone, bulk)] == [302] * 4
    assert not Cluster.objects.filter(pk=beta.pk).exists() and not Run.objects.filter(pk__in=runs)
    gamma = Cluster.objects.get(name="gamma")
    logged = entries(id__gt=since, action__startswith="admin.")
    assert [(e.action, e.target, e.cluster_id, e.actor_name) for e in logged] == [
        ("admin.add", f"clusters.cluster:{gamma.pk}", gamma.pk, "root"),
        ("admin.change", f"clusters.cluster:{alpha.pk}", alpha.pk, "root"),
        ("admin.delete", f"clusters.cluster:{beta.pk}", beta.pk, "root"),
        *[("admin.delete", f"runs.run:{pk}", alpha.pk, "root") for pk in runs],
    ]
    assert logged[1].detail["change"] == [{"changed": {"fields": ["Name"]}}]
    assert logged[2].cluster_name == "beta" and logged[2].client_ip == "127.0.0.1"


def test_an_expiry_is_audited_as_the_systems(alpha, olga):
    command, _ = command_issue(user=olga, cluster=alpha, kind="checkpoint",
                               run=Run.objects.get(cluster=alpha), idempotency_key="k")  # fmt: skip
    Command.objects.filter(pk=command.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert commands_sweep()["expired"] == 1
    [entry] = entries(action="command.expire", target=f"command:{command.pk}")
    assert (entry.actor_kind, entry.actor_name, entry.cluster_id, entry.outcome) == (
        "system", "expiry sweep", alpha.pk, "succeeded"
    )  # fmt: skip
    assert entry.detail["kind"] == "checkpoint"


@pytest.mark.parametrize(("name", "actor"), [("", "token {id}"), ("rack-7", "rack-7 (token {id})")])
def test_an_agent_acting_is_named_by_its_token(alpha, olga, name, actor):
    token, secret = token_issue(cluster_name="alpha", name=name)
    command, _ = command_issue(user=olga, cluster=alpha, kind="checkpoint",
                               run=Run.objects.get(cluster=alpha), idempotency_key="k")  # fmt: skip
    acked = Client().post(
        f"/api/v1/commands/{command.pk}/ack",
        {"state": "accepted", "step": 100},  # a checkpoint's accept names its step
        "application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert acked.status_code == 200, acked.content
    [entry] = entries(action="command.ack", target=f"command:{command.pk}")
    assert (entry.actor_kind, entry.actor_name) == ("agent", actor.format(id=token.pk))
    assert entry.detail["agent_token"] == {"id": token.pk, "name": name, "nodes": []}


def test_the_audit_page_and_api_show_every_new_kind(alpha, root):
    from apps.audit.services import audit_record

    made = [
        audit_record(action=action, outcome=outcome, actor_kind=kind, actor_name=f"who-{i}",
                     cluster=alpha, target=f"t-{uuid.uuid4().hex}")
        for i, (action, outcome, kind) in enumerate([
            ("command.expire", "succeeded", "system"),
            ("command.stop", "invalid", "token"),
            ("agent_token.issue", "succeeded", "user"),
            ("admin.delete", "succeeded", "user"),
            ("command.ack", "allowed", "agent"),
        ])
    ]  # fmt: skip
    page = root.get("/audit/")
    assert page.status_code == 200
    for entry in made:
        assert entry.target in page.content.decode()
    since = made[0].at.timestamp()
    listed = root.get(f"/api/v1/audit?since={since}&outcome=invalid")
    assert listed.status_code == 200, listed.content
    assert made[1].pk in {e["id"] for e in listed.json()["entries"]}
    everything = root.get(f"/api/v1/audit?since={since}").json()["entries"]
    assert {"system", "agent"} <= {e["actor_kind"] for e in everything}
