"""Commands: operators issue them, agents long-poll and acknowledge them (docs/actions.md)."""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

from django.http import HttpRequest
from ninja import Header, Query, Router, Status

from apps.access.auth import reader_auth, session_auth, user_token_auth
from apps.access.selectors import clusters_visible
from apps.access.services import attempt_hidden_record
from apps.clusters.models import Cluster, Node
from apps.commands import services
from apps.commands.choices import NODE_KINDS, CommandKind, CommandState
from apps.commands.longpoll import REDIRECTS_HEADER
from apps.commands.longpoll_wsgi import longpoll_redirect, poll_sync
from apps.commands.plan import run_plan
from apps.commands.schemas import (
    AckIn,
    CommandIn,
    CommandOut,
    CommandsOut,
    CommandsQuery,
    PlanOut,
)
from apps.commands.selectors import (
    command_get,
    command_handed_to,
    command_json,
    command_list,
)
from apps.core.auth import COMMAND_NOT_OURS, NODE_NOT_OURS, agent_auth
from apps.core.errors import Errors, FieldError
from apps.core.openapi import COMMAND, COMMAND_ACK, NODE_SERIES, RUN, link, links, links_each
from apps.runs.models import Run

router = Router(tags=["commands"])

# The links of an issued command (docs/api.md#links): an agent acknowledges a run command;
# a node command is carried out by the scheduler hook, and acknowledged by none.
_COMMAND = link(COMMAND, "the command: its state and history", command_id="$response.body#/id")
_ACK = link(
    COMMAND_ACK, "an agent acknowledges it (a run command)", command_id="$response.body#/id"
)
_RUN = link(
    RUN, "the run it targets", name="$response.body#/run", cluster="$response.body#/cluster"
)
_NODE = link(
    NODE_SERIES,
    "the node it targets",
    name="$response.body#/node",
    cluster="$response.body#/cluster",
)


@router.post(
    "/commands",
    auth=[user_token_auth, session_auth],
    response={
        200: CommandOut,
        201: CommandOut,
        202: CommandOut,
        400: Errors,
        401: Errors,
        403: Errors,
        404: Errors,
        409: Errors,
        422: Errors,
    },
    summary="Issue a command (operators; the same Idempotency-Key again: the same command)",
    description=(
        "A run command answers `201`. A node command (cordon, uncordon, drain) answers `202` "
        "while still `issued`: its scheduler hook runs in a task, and the command's state "
        "tells its outcome (`succeeded` / `failed` with the hook's result; a drain becomes "
        "`accepted`). A second drain of a node whose drain is live answers `200` with that "
        "drain; a cordon or uncordon while the node drains answers `409`. "
        "The `Idempotency-Key` is the caller's (its user, or the personal token it came "
        "with) in the cluster, and bound to the request: sent again with the same kind, "
        "target and args it answers `200` with the command it made; with another kind, "
        "target or args, `422`. A key names its command for `COMMANDS_IDEMPOTENCY_TTL_S` "
        "(24 h); after that it makes a new one."
    ),
    openapi_extra=links_each(
        {
            200: {"Command": _COMMAND, "Ack": _ACK, "Run": _RUN, "Node": _NODE},
            201: {"Command": _COMMAND, "Ack": _ACK, "Run": _RUN},
            202: {"Command": _COMMAND, "Node": _NODE},
        }
    ),
)
def command_create(
    request: HttpRequest,
    payload: CommandIn,
    idempotency_key: str = Header(..., alias="Idempotency-Key", min_length=1, max_length=128),
):
    clusters = clusters_visible(user=request.user)
    if payload.cluster:
        clusters = clusters.filter(name=payload.cluster)
    attempt = {"action": f"command.{payload.kind}", "cluster": payload.cluster, "payload": payload}
    run = _one(request, Run, "run", payload.run, clusters, attempt) if payload.run else None
    node = _one(request, Node, "node", payload.node, clusters, attempt) if payload.node else None
    target = run or node
    if target is None:
        _invalid(request, payload, None, "run", "a command names a run or a node")
    if run and node and run.cluster_id != node.cluster_id:
        _invalid(request, payload, run, "node", "the node is in another cluster than the run")
    try:
        command, created = services.command_issue(
            user=request.user,
            cluster=target.cluster,
            kind=payload.kind,
            run=run,
            node=node,
            args=payload.args.model_dump(exclude_none=True),
            reason=payload.reason,
            idempotency_key=idempotency_key,
            request=request,
        )
    except services.CommandDenied as denied:
        raise FieldError(403, "", str(denied)) from None
    except services.CommandInvalid as invalid:
        raise FieldError(400, invalid.loc, invalid.msg) from None
    except services.IdempotencyMismatch as mismatch:
        raise FieldError(422, "Idempotency-Key", str(mismatch)) from None
    except services.NodeBusy as busy:
        raise FieldError(409, "node", str(busy)) from None
    status = 200
    if created:
        status = 202 if command.kind in NODE_KINDS else 201
    return Status(status, command_json(command_get(command_id=command.pk)))


def _one(request: HttpRequest, model, loc: str, name: str, clusters, attempt: dict) -> Any:
    found = list(
        model.objects.filter(name=name, cluster__in=clusters).select_related("cluster")[:2]
    )
    if not found:
        # audited: an operator probing clusters they hold no role in is news to its admins
        named = model.objects.filter(name=name).exclude(cluster__in=clusters)
        if attempt["cluster"]:
            named = named.filter(cluster__name=attempt["cluster"])
        hidden = Cluster.objects.filter(pk__in=named.values("cluster_id")).order_by("name")
        attempt_hidden_record(
            user=request.user,
            action=attempt["action"],
            target=f"{loc}:{name}",
            clusters=hidden,
            request=request,
        )
        raise FieldError(404, loc, f"no such {loc}")
    if len(found) > 1:
        _invalid(request, attempt["payload"], None, "cluster",
                 f"several clusters have a {loc} {name!r}: name one")  # fmt: skip
    return found[0]


def _invalid(request: HttpRequest, payload: CommandIn, target: Any, loc: str, msg: str) -> NoReturn:
    """Refuse the command as invalid (400 naming `loc`), audited (outcome `invalid`)."""
    services.command_invalid_record(
        user=request.user,
        kind=payload.kind,
        loc=loc,
        msg=msg,
        cluster=getattr(target, "cluster", None),
        target=f"run:{payload.run}" if payload.run else f"node:{payload.node or ''}",
        reason=payload.reason,
        request=request,
    )
    raise FieldError(400, loc, msg)


@router.get(
    "/commands",
    auth=[agent_auth, user_token_auth, session_auth],
    response={200: CommandsOut, 307: None, 400: Errors, 401: Errors, 403: Errors},
    summary="Agents: long-poll for the node's commands. Users: the commands, newest first",
    description=(
        "An agent's poll with `wait` > 0 sent with `X-Opsboard-Redirects: follow` may be "
        "answered `307 Temporary Redirect` to the same host on the port of the ASGI server, "
        "which holds long-polls cheaply: follow it with the same Authorization (to the same "
        "host only) and poll there from then on."
    ),
    openapi_extra=links(
        (200,),
        Command=link(COMMAND, "the first command", command_id="$response.body#/commands/0/id"),
        Ack=link(
            COMMAND_ACK,
            "the agent acknowledges the first command",
            command_id="$response.body#/commands/0/id",
        ),
    ),
)
def commands(
    request: HttpRequest,
    query: Query[CommandsQuery],
    redirects: str | None = Header(
        default=None,
        alias=REDIRECTS_HEADER,
        max_length=32,
        description="agents: `follow` if you follow a 307 to the same host with your token",
    ),
):
    token = getattr(request, "agent_token", None)
    if token is None:
        clusters = clusters_visible(user=request.user)
        if query.cluster:
            clusters = clusters.filter(name=query.cluster)
        found = command_list(clusters=clusters, run=query.run, node=query.node, state=query.state)
        return {"commands": [command_json(command) for command in found]}
    if not query.node:
        raise FieldError(400, "node", "an agent polls for one node")
    if not token.acts_for(query.node):
        raise FieldError(403, "node", NODE_NOT_OURS)
    follows = (redirects or "").strip().lower() == "follow"
    if query.wait > 0 and (redirect := longpoll_redirect(request, follows=follows)) is not None:
        return redirect
    handed = poll_sync(
        cluster_id=token.cluster_id,
        node_name=query.node,
        kinds=query.kind_set,
        wait=query.wait,
        run=query.run,
    )
    return {"commands": handed}


@router.get(
    "/commands/{command_id}",
    auth=reader_auth,
    # 400: a command_id that is no UUID (found by the stateful fuzz test's negative cases)
    response={200: CommandOut, 400: Errors, 401: Errors, 404: Errors},
    summary="A command: its target, state and history",
    openapi_extra=links(
        (200,),
        Ack=link(COMMAND_ACK, "the agent acknowledges it", command_id="$response.body#/id"),
        Run=link(
            RUN,
            "the run it targets (a run command)",
            name="$response.body#/run",
            cluster="$response.body#/cluster",
        ),
    ),
)
def command_detail(request: HttpRequest, command_id: uuid.UUID):
    command = command_get(command_id=command_id, clusters=_reader_clusters(request))
    if command is None:
        raise FieldError(404, "command_id", "no such command")
    return command_json(command)


def _reader_clusters(request: HttpRequest):
    token = getattr(request, "agent_token", None)
    if token is not None:
        return Cluster.objects.filter(pk=token.cluster_id)
    return clusters_visible(user=request.user)


@router.post(
    "/commands/{command_id}/ack",
    auth=agent_auth,
    response={200: CommandOut, 400: Errors, 401: Errors, 403: Errors, 404: Errors, 409: Errors},
    summary="An agent acknowledges a command: accepted, succeeded or failed",
    openapi_extra=links(
        (200,),
        Command=link(COMMAND, "the command, as operators see it", command_id="$response.body#/id"),
    ),
)
def command_ack(request: HttpRequest, command_id: uuid.UUID, payload: AckIn):
    command = command_get(command_id=command_id, clusters=_reader_clusters(request))
    if command is None or command.kind not in (
        CommandKind.CHECKPOINT,
        CommandKind.STOP,
        CommandKind.RESUME,
    ):
        raise FieldError(404, "command_id", "no such command")
    refusal = _ack_refusal(request, command, payload)
    if refusal is not None:
        status, loc, outcome, why = refusal
        services.command_ack_refused(
            command=command, state=payload.state, outcome=outcome, why=why, request=request
        )
        raise FieldError(status, loc, why)
    try:
        command = services.command_ack(
            command=command,
            state=CommandState(payload.state),
            message=payload.message or payload.detail,
            step=payload.step,
            ranks=payload.ranks,
            actor_name=request.agent_token.name,
            request=request,
        )
    except services.CommandConflict as conflict:
        raise FieldError(409, "state", str(conflict)) from None
    return command_json(command_get(command_id=command.pk))


def _ack_refusal(request: HttpRequest, command, payload: AckIn) -> tuple[int, str, str, str] | None:
    """(status, field, audit outcome, why) when the ack is refused before the state machine."""
    if (
        command.kind == CommandKind.CHECKPOINT
        and payload.state == "accepted"
        and payload.step is None
    ):
        # the step is what the server waits for: without it the command could only expire
        return 400, "step", "invalid", "an accepted checkpoint names the step the ranks agreed on"
    token = request.agent_token
    if not token.is_cluster_wide and not any(
        token.acts_for(node) for node in command_handed_to(command=command)
    ):
        return 403, "command_id", "denied", COMMAND_NOT_OURS
    return None


@router.get(
    "/runs/{name}/plan",
    auth=reader_auth,
    response={200: PlanOut, 400: Errors, 401: Errors, 404: Errors},
    summary="For launchers: the newest durable checkpoint and the run's healthy nodes",
    openapi_extra=links(
        (200,),
        Run=link(RUN, "the run", name="$response.body#/run", cluster="$request.query.cluster"),
        Node=link(
            NODE_SERIES,
            "the first healthy node's series",
            name="$response.body#/nodes/0",
            cluster="$request.query.cluster",
        ),
    ),
)
def plan(request: HttpRequest, name: str, cluster: str | None = None):
    runs = Run.objects.filter(name=name, cluster__in=_reader_clusters(request))
    if cluster:
        runs = runs.filter(cluster__name=cluster)
    found = list(runs[:2])
    if len(found) != 1:
        raise FieldError(404, "name", "no such run")
    return run_plan(run=found[0])
