"""Two clusters for the API fuzz test: `home`, where every identity has its token or role,
and `foreign`, where none has, seeded with a run, nodes, an alert, commands and audit
entries whose names carry FOREIGN_MARK so that any of them in a response is recognised."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.test import Client

from apps.access.services import role_grant, user_token_issue
from apps.alerts.models import Alert
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from apps.commands.models import Command
from apps.runs.models import Run, StepReport

FOREIGN_MARK = "frgn7q"
HOME, FOREIGN = "home-fz", f"{FOREIGN_MARK}-cluster"
HOME_NODES, FOREIGN_NODES = ("node-01", "node-02"), (f"{FOREIGN_MARK}-node-01", "node-02")
HOME_RUN, FOREIGN_RUN = "run-1", f"{FOREIGN_MARK}-run"
# The foreign commands' ids: fixed, so that the fuzz test recognises them in any response.
FOREIGN_COMMAND_IDS = (
    uuid.UUID("f0e1a9e0-0000-4000-8000-00000000f0e1"),
    uuid.UUID("f0e1a9e0-0000-4000-8000-00000000f0e2"),
)
IDENTITIES = (
    "agent", "agent-node", "viewer", "operator", "admin", "operator-token", "anonymous",
)  # fmt: skip


@dataclass
class Identity:
    """How a request authenticates: a bearer token, or a session cookie with its CSRF pair."""

    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)


@dataclass
class World:
    identity: Identity
    # values a string parameter is drawn from besides the generator's own: the names and ids
    # of both clusters, so that the fuzzer asks for foreign objects as often as for its own
    names: list[str]
    clusters: list[str]
    alert_ids: list[int]
    command_ids: list[str]


def _cluster(name: str, nodes: tuple[str, ...], run_name: str) -> tuple[Cluster, str, str, Run]:
    token, secret = token_issue(cluster_name=name, name="agent")
    _, node_secret = token_issue(cluster_name=name, name="gpu-agent", nodes=[nodes[0]])
    cluster = token.cluster
    run = Run.objects.create(cluster=cluster, name=run_name)
    now = datetime.now(UTC)
    for rank, node_name in enumerate(nodes):
        node = Node.objects.create(cluster=cluster, name=node_name)
        StepReport.objects.create(run=run, node=node, ts=now, rank=rank, step=100, step_time=1.0)
    Run.objects.filter(pk=run.pk).update(last_step=100, last_step_at=now)
    return cluster, secret, node_secret, run


def _alert(cluster: Cluster, run: Run, subject: str) -> Alert:
    now = datetime.now(UTC)
    return Alert.objects.create(
        cluster=cluster, kind="straggler", subject=subject, severity="warning", run=run,
        node=Node.objects.filter(cluster=cluster).first(), rank=0, summary=f"slow {subject}",
        opened_at=now - timedelta(minutes=5), last_seen_at=now,
    )  # fmt: skip


def _commands(cluster: Cluster, run: Run, ids: tuple[uuid.UUID, ...] = ()) -> list[Command]:
    node = Node.objects.filter(cluster=cluster).first()
    now = datetime.now(UTC)
    made = [
        Command.objects.create(
            cluster=cluster, kind="checkpoint", run=run, reason=f"save {run.name}",
            idempotency_key=uuid.uuid4().hex, state="issued", issued_at=now,
            expires_at=now + timedelta(hours=1),
        ),
        Command.objects.create(
            cluster=cluster, kind="cordon", node=node, reason=f"cordon {node.name}",
            idempotency_key=uuid.uuid4().hex, state="succeeded", issued_at=now,
            expires_at=now + timedelta(hours=1),
        ),
    ]  # fmt: skip
    for command, fixed_id in zip(made, ids, strict=False):
        Command.objects.filter(pk=command.pk).update(id=fixed_id)
        command.id = fixed_id
    return made


def _session(user) -> Identity:
    """A logged-in browser: its session cookie and a CSRF cookie with the matching header
    (what the page's JavaScript sends), checked by Django's CSRF middleware as any other."""
    client = Client()
    client.force_login(user)
    page = HttpRequest()
    masked = get_token(page)  # as a page's {% csrf_token %} renders it, with its cookie
    return Identity(
        headers={"X-CSRFToken": masked},
        cookies={
            settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value,
            settings.CSRF_COOKIE_NAME: page.META["CSRF_COOKIE"],
        },
    )


def build_world(identity: str) -> World:
    home, agent_secret, node_secret, home_run = _cluster(HOME, HOME_NODES, HOME_RUN)
    foreign, _, _, foreign_run = _cluster(FOREIGN, FOREIGN_NODES, FOREIGN_RUN)
    home_alert = _alert(home, home_run, "run-1/rank-0")
    foreign_alert = _alert(foreign, foreign_run, f"{FOREIGN_RUN}/rank-0")
    home_commands = _commands(home, home_run)
    _commands(foreign, foreign_run, FOREIGN_COMMAND_IDS)
    users = get_user_model().objects
    # the foreign cluster's admin: the audit log holds entries of the foreign cluster
    role_grant(user=users.create_user(f"{FOREIGN_MARK}-admin"), cluster=foreign, role="admin")
    if identity == "agent":
        chosen = Identity(headers={"Authorization": f"Bearer {agent_secret}"})
    elif identity == "agent-node":
        chosen = Identity(headers={"Authorization": f"Bearer {node_secret}"})
    elif identity == "operator-token":  # a personal API token (obu_…) of a home operator
        user = users.create_user("fuzz-operator-token")
        role_grant(user=user, cluster=home, role="operator")
        chosen = Identity(headers={"Authorization": f"Bearer {user_token_issue(user=user)[1]}"})
    elif identity in ("viewer", "operator", "admin"):
        user = users.create_user(f"fuzz-{identity}")
        role_grant(user=user, cluster=home, role=identity)
        chosen = _session(user)
    else:
        chosen = Identity()
    return World(
        identity=chosen,
        names=[*HOME_NODES, HOME_RUN, *FOREIGN_NODES, FOREIGN_RUN],
        clusters=[HOME, FOREIGN],
        alert_ids=[home_alert.pk, foreign_alert.pk],
        command_ids=[str(c.pk) for c in home_commands] + [str(i) for i in FOREIGN_COMMAND_IDS],
    )
