"""Every page of the Django admin is scoped by cluster roles. The test walks the admin's
registry (a model registered later is walked too, and must say here which of its objects
belong to which cluster) as a staff user holding a role on cluster alpha only, with every
Django model permission, while objects of clusters alpha and bravo are present: bravo's
objects are never listed, their pages are 404/403, deleting them and acting on them changes
nothing, and read-only fields stay as stored when a changed value is posted. Every action
declares the permissions it needs (allowed_permissions)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Model
from django.test import Client, RequestFactory
from django.utils import timezone

from apps.access.admin_scoping import ClusterScopedAdmin
from apps.access.models import ClusterRole
from apps.access.services import role_grant, user_token_issue
from apps.alerts.models import Alert, ClusterDetectorConfig, Incident, WebhookEndpoint
from apps.audit.services import audit_record
from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.commands.models import AutoCordonPolicy, ClusterHooks, Command
from apps.commands.services import command_create
from apps.ingest.models import InboxBatch, QuarantinedBatch
from apps.runs.models import Run, RunEvent
from apps.telemetry.models import Metric, NodeHealth

pytestmark = pytest.mark.django_db

REGISTERED = sorted(admin.site._registry, key=lambda model: model._meta.label)
# Who reads each page's rows of a cluster (as the pages and the audit API): any role, the
# cluster's admins, the owner (a personal token), or superusers only (no cluster's business).
READ_BY = {
    "viewer": ["clusters.Cluster", "clusters.Node", "runs.Run", "runs.RunEvent",
               "telemetry.NodeHealth", "alerts.Alert", "alerts.ClusterDetectorConfig",
               "alerts.Incident", "commands.Command"],
    "admin": ["access.ClusterRole", "clusters.AgentToken", "audit.AuditEntry",
              "alerts.WebhookEndpoint", "ingest.QuarantinedBatch", "commands.AutoCordonPolicy"],
    "owner": ["access.UserToken"],
    "superuser": ["commands.ClusterHooks", "telemetry.Metric", "auth.User", "auth.Group",
                  "axes.AccessAttempt", "axes.AccessLog", "axes.AccessFailureLog"],
}  # fmt: skip
# Objects of no cluster (superusers' business): nothing on their pages is a staff user's own.
GLOBAL = {"auth.User", "auth.Group", "telemetry.Metric", "axes.AccessAttempt", "axes.AccessLog",
          "axes.AccessFailureLog"}  # fmt: skip
OWNABLE = [model for model in REGISTERED if model._meta.label not in GLOBAL]
# Read-only wherever they appear (the issue's list); a run event is read-only as a whole.
READ_ONLY = ["cluster", "revoked_at", "state", "ended_at", "digest"]


@dataclass
class World:
    ada: Client  # staff, a role on alpha only, every model permission
    root: Client
    ada_user: Model
    mine: dict[str, Model | None]  # model label → ada's own object (None: nothing is hers)
    theirs: dict[str, Model]  # model label → an object she must never meet


def cluster_objects(name: str) -> dict[str, Model]:
    """One object of each cluster-scoped model, on cluster `name`; every name holds it."""
    now = timezone.now()
    token, _ = token_issue(cluster_name=name, name=f"{name}-agent")
    cluster = token.cluster
    node = Node.objects.create(cluster=cluster, name=f"{name}-node")
    run = Run.objects.create(cluster=cluster, name=f"{name}-run")
    batch = InboxBatch.objects.create(
        token=token, batch_id=f"{name}-batch", payload=b"{}", node=f"{name}-node",
        processed_at=now, quarantined_at=now, error=f"{name} broke",
    )  # fmt: skip
    command, _ = command_create(
        cluster_id=cluster.pk, kind="checkpoint", run_id=run.pk, idempotency_key=name
    )
    objects = [
        cluster, token, node, run, command,
        QuarantinedBatch.objects.get(pk=batch.pk),
        RunEvent.objects.create(cluster=cluster, node=node, run=run, ts=now, kind="log",
                                data={"message": f"{name} says"}),
        NodeHealth.objects.create(node=node, ts=now, values={f"{name}_temp": 40}),
        Alert.objects.create(cluster=cluster, kind="straggler", subject=f"{name}-subject",
                             severity="warning", run=run, node=node, summary=f"{name} alert",
                             opened_at=now, last_seen_at=now),
        Incident.objects.create(cluster=cluster, root_kind="xid", root_node=f"{name}-node",
                                opened_at=now),
        WebhookEndpoint.objects.create(cluster=cluster, url=f"http://127.0.0.1:9/{name}"),
        ClusterDetectorConfig.objects.create(cluster=cluster),
        ClusterHooks.objects.create(cluster=cluster, cordon_argv=["true", name]),
        AutoCordonPolicy.objects.create(cluster=cluster),
        audit_record(action="test.note", outcome="succeeded", actor_name=f"{name}-bot",
                     cluster=cluster, target=f"node:{name}-node"),
    ]  # fmt: skip
    return {type(obj)._meta.label: obj for obj in objects}


def build(role: str) -> World:
    users = get_user_model().objects
    alpha, bravo = cluster_objects("alpha"), cluster_objects("bravo")
    ada = users.create_user("ada", password="pw-12345-x", is_staff=True)
    content_types = [
        ContentType.objects.get_for_model(model, for_concrete_model=False) for model in REGISTERED
    ]
    ada.user_permissions.add(*Permission.objects.filter(content_type__in=content_types))
    bob = users.create_user("bravo-bob", password="pw-12345-x", is_staff=True)
    root = users.create_superuser("root", password="pw-12345-x")
    alpha_cluster, bravo_cluster = alpha["clusters.Cluster"], bravo["clusters.Cluster"]
    role_grant(user=ada, cluster=alpha_cluster, role=role)
    role_grant(user=bob, cluster=bravo_cluster, role="admin")
    access = {"user_agent": "bravo-agent", "ip_address": "10.0.0.2", "username": "bravo-bob",
              "http_accept": "*/*", "path_info": "/accounts/login/"}  # fmt: skip
    global_objects = {
        "auth.User": bob,
        "auth.Group": Group.objects.create(name="bravo-group"),
        "telemetry.Metric": Metric.objects.create(name="bravo_metric"),
        "axes.AccessAttempt": AccessAttempt.objects.create(
            **access, get_data="", post_data="", failures_since_start=1
        ),
        "axes.AccessLog": AccessLog.objects.create(**access),
        "axes.AccessFailureLog": AccessFailureLog.objects.create(**access),
    }
    mine = {
        **alpha,
        "access.ClusterRole": ClusterRole.objects.get(user=ada),
        "access.UserToken": user_token_issue(user=ada, name="ada-laptop")[0],
    }
    theirs = {
        **bravo,
        **global_objects,
        "access.ClusterRole": ClusterRole.objects.get(user=bob),
        "access.UserToken": user_token_issue(user=bob, name="bravo-laptop")[0],
    }
    assert set(global_objects) == GLOBAL
    mine.update(dict.fromkeys(global_objects))
    return World(ada=_client(ada), root=_client(root), ada_user=ada, mine=mine, theirs=theirs)


def _client(user) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def url(model: type[Model], page: str = "", obj: Model | None = None) -> str:
    base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    return base if obj is None else f"{base}{obj.pk}/{page}/"


def snapshot() -> dict[str, list]:
    """Every row of every model of ours and of the registered ones."""
    models = {m for m in apps.get_models() if m.__module__.startswith("apps.")}
    return {
        model._meta.label: [
            {k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()}
            for row in model._default_manager.order_by("pk").values()
        ]
        for model in models | set(REGISTERED)
    }


class _FormFields(HTMLParser):
    """The values a browser would submit from the admin's change form."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id, self.inside, self.data = form_id, False, {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "option" and self._select is not None and "selected" in a:
            self.data[self._select] = a.get("value", "")
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside or not a.get("name"):
            return
        if tag == "input" and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            checkable = a.get("type") in ("checkbox", "radio")
            self.data[a["name"]] = a.get("value", "on" if checkable else "")
        elif tag == "select":
            self._select = a["name"]
        elif tag == "textarea":
            self._textarea = a["name"]
            self.data[a["name"]] = ""

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag == "form":
            self.inside = False
        if tag == "select":
            self._select = None
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea is not None:
            self.data[self._textarea] += data


def form_data(page, model: type[Model]) -> dict[str, str]:
    parser = _FormFields(f"{model._meta.model_name}_form")
    parser.feed(page.content.decode())
    return {**parser.data, "_save": "Save"}


def tampered(model: type[Model], obj: Model, other_cluster_pk: int) -> dict[str, str]:
    """Changed values for the model's read-only fields, as a form would post them."""
    names = [f.name for f in model._meta.fields] if model is RunEvent else READ_ONLY
    values: dict[str, str] = {}
    for name in names:
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        if name == "cluster" or field.is_relation:
            values[name] = str(other_cluster_pk) if name == "cluster" else ""
        elif field.get_internal_type() == "DateTimeField":
            values |= {name: "2020-01-01 00:00:00", f"{name}_0": "2020-01-01",
                       f"{name}_1": "00:00:00"}  # fmt: skip
        elif field.choices:
            current = getattr(obj, field.attname)
            values[name] = next(value for value, _ in field.choices if value != current)
        elif field.get_internal_type() in ("IntegerField", "BigIntegerField"):
            values[name] = "999"
        else:
            values[name] = "0" * 64
    return values


def stored(obj: Model) -> dict:
    fresh = type(obj)._default_manager.get(pk=obj.pk)
    names = [f.attname for f in type(obj)._meta.fields]
    return {name: getattr(fresh, name) for name in names}


def request_of(user):
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def reads_own(label: str, role: str) -> bool:
    """Whether a user with `role` on alpha meets their own object of this page."""
    return (
        label in READ_BY["owner"]
        or label in READ_BY[role]
        or (role == "admin" and label in READ_BY["viewer"])
    )


def test_every_registered_model_is_walked_and_scoped_by_the_base_class(db):
    world = build("admin")
    labels = {model._meta.label for model in REGISTERED}
    assert labels == set(world.theirs) == {label for group in READ_BY.values() for label in group}
    root = get_user_model().objects.get(username="root")
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, ClusterScopedAdmin), model._meta.label
        for func, name, _ in model_admin.get_actions(request_of(root)).values():
            if func.__module__.startswith("axes."):
                continue  # axes' own, on a page for superusers only
            assert getattr(func, "allowed_permissions", ()), f"{model._meta.label}: {name}"


@pytest.mark.parametrize("role", ["viewer", "admin"])
@pytest.mark.parametrize("model", REGISTERED, ids=lambda model: model._meta.label)
def test_a_staff_user_never_meets_another_clusters_objects(model, role):
    world = build(role)
    label = model._meta.label
    theirs, mine = world.theirs[label], world.mine[label]
    before = snapshot()

    listing = world.ada.get(url(model))
    if label in READ_BY["superuser"]:
        assert listing.status_code == 403
    else:
        assert listing.status_code == 200
        shown = set(listing.context["cl"].queryset.values_list("pk", flat=True))
        assert theirs.pk not in shown
        assert (mine.pk in shown) == reads_own(label, role)
        assert b"bravo" not in listing.content  # nor in the filters, counts or names

    for page in ("change", "delete", "history"):
        assert world.ada.get(url(model, page, theirs)).status_code in (403, 404), page
    edit = world.root.get(url(model, "change", theirs))
    assert edit.status_code == 200
    data = {**form_data(edit, model), "name": "renamed-by-ada"}
    assert world.ada.post(url(model, "change", theirs), data).status_code in (403, 404)
    assert world.ada.post(url(model, "delete", theirs), {"post": "yes"}).status_code in (
        403,
        404,
    )

    actions = listing.context["action_form"] if listing.status_code == 200 else None
    names = [name for name, _ in actions.fields["action"].choices if name] if actions else []
    for name in names:
        world.ada.post(
            url(model),
            {"action": name, "_selected_action": [theirs.pk], "post": "yes", "apply": "yes",
             "token": str(uuid.uuid4()), "reason": "ada was here",
             "confirm": getattr(theirs, "name", "")},
        )  # fmt: skip
    assert snapshot() == before  # nothing of anyone's changed, no command, no audit entry


@pytest.mark.parametrize("role", ["viewer", "admin"])
@pytest.mark.parametrize("model", OWNABLE, ids=lambda model: model._meta.label)
def test_read_only_fields_stay_as_stored_when_posted(model, role):
    world = build(role)
    mine = world.mine[model._meta.label]
    assert mine is not None
    page = world.ada.get(url(model, "change", mine))
    if not reads_own(model._meta.label, role):
        assert page.status_code in (403, 404)
        return
    assert page.status_code == 200
    form = page.context["adminform"].form
    read_only = READ_ONLY if model is not RunEvent else [f.name for f in RunEvent._meta.fields]
    assert not set(read_only) & set(form.fields)
    before = stored(mine)
    bravo = world.theirs["clusters.Cluster"].pk
    saved = world.ada.post(
        url(model, "change", mine), {**form_data(page, model), **tampered(model, mine, bravo)}
    )
    model_admin = admin.site.get_model_admin(model)
    may_change = model_admin.has_change_permission(request_of(world.ada_user), mine)
    errors = saved.context and saved.context["adminform"].form.errors
    assert saved.status_code == (302 if may_change else 403), errors
    after = stored(mine)
    for field in model._meta.fields:
        if field.name in read_only or field.attname in read_only:
            assert after[field.attname] == before[field.attname], field.name


@pytest.mark.parametrize("model", REGISTERED, ids=lambda model: model._meta.label)
def test_a_superuser_sees_every_clusters_objects(model):
    world = build("viewer")
    listing = world.root.get(url(model))
    assert listing.status_code == 200
    shown = set(listing.context["cl"].queryset.values_list("pk", flat=True))
    assert world.theirs[model._meta.label].pk in shown
    mine = world.mine[model._meta.label]
    assert mine is None or mine.pk in shown


def test_choices_and_lookups_offer_only_the_users_clusters():
    world = build("admin")
    alpha, bravo = world.mine["clusters.Cluster"], world.theirs["clusters.Cluster"]
    form = world.ada.get("/admin/clusters/node/add/").context["adminform"].form
    assert list(form.fields["cluster"].queryset) == [alpha]
    refused = world.ada.post(
        "/admin/clusters/node/add/", {"cluster": bravo.pk, "name": "n9", "info": "{}"}
    )
    assert refused.status_code == 200 and "cluster" in refused.context["adminform"].form.errors
    assert not Node.objects.filter(name="n9").exists()
    found = world.ada.get(
        "/admin/autocomplete/",
        {"app_label": "alerts", "model_name": "alert", "field_name": "run", "term": "run"},
    )
    assert found.status_code == 200
    assert [item["text"] for item in found.json()["results"]] == ["alpha/alpha-run"]
    popup = world.ada.get("/admin/runs/run/", {"_to_field": "id", "_popup": "1"})
    assert b"alpha-run" in popup.content and b"bravo" not in popup.content


def test_a_command_action_is_still_checked_per_cluster_role():
    world = build("viewer")
    node = world.mine["clusters.Node"]
    done = world.ada.post(
        "/admin/clusters/node/",
        {"action": "cordon", "_selected_action": [node.pk], "apply": "yes",
         "token": str(uuid.uuid4()), "reason": "let me"},
    )  # fmt: skip
    assert done.status_code == 302
    assert Node.objects.get(pk=node.pk).state == "active"
    assert not Command.objects.filter(kind="cordon").exists()
