from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import field_validator

from apps.access.auth import reader_auth, session_auth, user_token_auth
from apps.access.selectors import clusters_visible
from apps.access.services import attempt_hidden_record
from apps.alerts.selectors import alert_get, alert_json, alert_list
from apps.alerts.selectors.incidents import incident_get, incident_list, incidents_json
from apps.alerts.services import (
    AlertAlreadyAcknowledged,
    AlertNotFiring,
    AlertResolved,
    alert_acknowledge,
    alert_acknowledge_authorize,
    alert_acknowledge_hidden,
    alert_silence,
    alert_silence_authorize,
)
from apps.alerts.services.ageing import SILENCE_MAX_MIN
from apps.alerts.services.incidents import (
    IncidentAlreadyAcknowledged,
    IncidentResolved,
    incident_acknowledge,
    incident_acknowledge_authorize,
    incident_acknowledge_hidden,
)
from apps.audit.choices import AuditAction
from apps.clusters.models import Cluster
from apps.core.bounds import NAME_MAX_LENGTH, text
from apps.core.db_router import replica_reads
from apps.core.errors import Errors, FieldError
from apps.core.middleware import NUL_MESSAGE
from apps.core.openapi import ALERT_ACK, ALERTS, NODE_SERIES, RUN, link, links
from apps.core.params import CLUSTER_MAX_LENGTH, timestamp_field

router = Router(tags=["alerts"])


class AlertOut(Schema):
    id: int
    kind: str
    severity: Literal["warning", "critical"]
    state: Literal["firing", "acknowledged", "resolved"]
    run: str | None
    node: str | None
    rank: int | None
    gpu: int | None
    summary: str
    evidence: dict[str, Any]
    opened_at: float
    acknowledged_at: float | None
    resolved_at: float | None
    incident: int | None = Field(description="the incident of its root cause")
    aged_at: float | None = Field(
        description="when this warning, left unacknowledged past its cluster's "
        "warning_age_min, escalated as ageing (once); null if it did not"
    )
    silenced_until: float | None = Field(description="an operator's silence of it ends then")
    silence_reason: str


class AlertsOut(Schema):
    alerts: list[AlertOut]


class AlertsQuery(Schema):
    run: str | None = Field(default=None, max_length=NAME_MAX_LENGTH)
    node: str | None = Field(default=None, max_length=NAME_MAX_LENGTH)
    state: Literal["firing", "acknowledged", "resolved"] | None = None
    since: float | None = timestamp_field("alerts that changed state since (Unix seconds)")
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )


class AckIn(Schema):
    # stored in a text column: no NUL (the query string and forms are checked by
    # apps.core.middleware, a JSON body only here)
    note: str = Field(default="", max_length=2000)

    @field_validator("note")
    @classmethod
    def no_nul(cls, note: str) -> str:
        if "\x00" in note:
            raise ValueError(NUL_MESSAGE)
        return note


@router.get(
    "/alerts",
    auth=reader_auth,
    response={200: AlertsOut, 400: Errors, 401: Errors, 404: Errors},
    summary="The cluster's alerts, newest first",
    openapi_extra=links(
        (200,),
        Ack=link(
            ALERT_ACK, "an operator acknowledges the newest", alert_id="$response.body#/alerts/0/id"
        ),
        Run=link(
            RUN,
            "the newest alert's run",
            name="$response.body#/alerts/0/run",
            cluster="$request.query.cluster",
        ),
        Node=link(
            NODE_SERIES,
            "the newest alert's node",
            name="$response.body#/alerts/0/node",
            cluster="$request.query.cluster",
        ),
    ),
)
@replica_reads
def alerts(request: HttpRequest, query: Query[AlertsQuery]):
    token = getattr(request, "agent_token", None)
    if token is not None:
        cluster: Cluster | None = Cluster(pk=token.cluster_id)
    elif query.cluster:
        cluster = clusters_visible(user=request.user).filter(name=query.cluster).first()
        if cluster is None:
            raise FieldError(404, "cluster", "no such cluster")
    else:
        cluster = None  # a user sees the clusters they hold a role in
    found = alert_list(
        cluster=cluster, run=query.run, node=query.node, state=query.state, since=query.since,
        visible=None if token is not None else clusters_visible(user=request.user),
    )  # fmt: skip
    return {"alerts": [alert_json(alert) for alert in found]}


@router.post(
    "/alerts/{alert_id}/ack",
    auth=[user_token_auth, session_auth],  # an operator: personal token, or login + CSRF
    response={200: AlertOut, 400: Errors, 401: Errors, 403: Errors, 404: Errors, 409: Errors},
    summary="Acknowledge a firing alert (operators of the alert's cluster)",
    openapi_extra=links(
        (200,),
        Alerts=link(ALERTS, "the alerts of its run", run="$response.body#/run"),
    ),
)
def alert_ack(request: HttpRequest, alert_id: int, payload: AckIn):
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        alert_acknowledge_hidden(user=request.user, alert_id=alert_id, request=request)
        raise FieldError(404, "alert_id", "no such alert")
    allowed = alert_acknowledge_authorize(
        user=request.user, alert=alert, note=payload.note, request=request
    )
    if not allowed:
        raise FieldError(403, "", "you may not acknowledge this cluster's alerts")
    try:
        acknowledged = alert_acknowledge(
            alert=alert, user=request.user, note=payload.note, request=request
        )
    except (AlertResolved, AlertAlreadyAcknowledged) as error:
        raise FieldError(409, "state", str(error)) from None
    return alert_json(alert_get(alert_id=acknowledged.pk))


class RootCauseOut(Schema):
    kind: str
    node: str | None
    gpu: int | None
    rank: int | None


class CandidateOut(RootCauseOut):
    alert: int | None


class IncidentOut(Schema):
    id: int
    state: Literal["open", "resolved"]
    root_cause: RootCauseOut | None = Field(description="null: unknown (see candidates)")
    candidates: list[CandidateOut]
    alerts: list[int]
    opened_at: float
    acknowledged_at: float | None
    resolved_at: float | None
    gpu_hours_lost: float


class IncidentsOut(Schema):
    incidents: list[IncidentOut]


class IncidentsQuery(Schema):
    state: Literal["open", "resolved"] | None = None
    run: str | None = Field(default=None, max_length=NAME_MAX_LENGTH)
    node: str | None = Field(default=None, max_length=NAME_MAX_LENGTH)
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )


def _reader_scope(request: HttpRequest, cluster_name: str | None) -> tuple[Cluster | None, Any]:
    """(the cluster asked for, the clusters visible): an agent token reads its own cluster;
    a user the clusters they hold a role in, or the one of them named (404 otherwise)."""
    token = getattr(request, "agent_token", None)
    if token is not None:
        return Cluster(pk=token.cluster_id), None
    visible = clusters_visible(user=request.user)
    if cluster_name:
        cluster = visible.filter(name=cluster_name).first()
        if cluster is None:
            raise FieldError(404, "cluster", "no such cluster")
        return cluster, visible
    return None, visible


@router.get(
    "/incidents",
    auth=reader_auth,
    response={200: IncidentsOut, 400: Errors, 401: Errors, 404: Errors},
    summary="The cluster's incidents (alerts folded by root cause), newest first",
)
@replica_reads
def incidents(request: HttpRequest, query: Query[IncidentsQuery]):
    cluster, visible = _reader_scope(request, query.cluster)
    found = incident_list(
        cluster=cluster, state=query.state, run=query.run, node=query.node, visible=visible
    )
    return {"incidents": incidents_json(found)}


@router.get(
    "/incidents/{incident_id}",
    auth=reader_auth,
    response={200: IncidentOut, 400: Errors, 401: Errors, 404: Errors},
    summary="One incident: its root cause, candidates, alerts and GPU-hours lost",
)
@replica_reads
def incident_detail(request: HttpRequest, incident_id: int):
    cluster, visible = _reader_scope(request, None)
    incident = incident_get(incident_id=incident_id, visible=visible)
    if incident is None or (cluster is not None and incident.cluster_id != cluster.pk):
        raise FieldError(404, "incident_id", "no such incident")
    return incidents_json([incident])[0]


@router.post(
    "/incidents/{incident_id}/ack",
    auth=[user_token_auth, session_auth],  # an operator: personal token, or login + CSRF
    response={200: IncidentOut, 400: Errors, 401: Errors, 403: Errors, 404: Errors, 409: Errors},
    summary="Acknowledge an open incident and its firing alerts (operators of its cluster)",
)
def incident_ack(request: HttpRequest, incident_id: int, payload: AckIn):
    incident = incident_get(incident_id=incident_id, visible=clusters_visible(user=request.user))
    if incident is None:
        incident_acknowledge_hidden(user=request.user, incident_id=incident_id, request=request)
        raise FieldError(404, "incident_id", "no such incident")
    allowed = incident_acknowledge_authorize(
        user=request.user, incident=incident, note=payload.note, request=request
    )
    if not allowed:
        raise FieldError(403, "", "you may not acknowledge this cluster's incidents")
    try:
        current = incident_acknowledge(
            incident=incident, user=request.user, note=payload.note, request=request
        )
    except (IncidentResolved, IncidentAlreadyAcknowledged) as error:
        raise FieldError(409, "state", str(error)) from None
    return incidents_json([current])[0]


class SilenceIn(Schema):
    minutes: int = Field(ge=1, le=SILENCE_MAX_MIN, description="how long, a week at most")
    # stored in a text column (no NUL, the pattern says so in the schema); a silence says why
    reason: text(2000, min_length=1)  # type: ignore[valid-type]

    @field_validator("reason")
    @classmethod
    def stated(cls, reason: str) -> str:
        if not reason.strip():
            raise ValueError("say why it is silenced")
        return reason


@router.post(
    "/alerts/{alert_id}/silence",
    auth=[user_token_auth, session_auth],  # an operator: personal token, or login + CSRF
    response={200: AlertOut, 400: Errors, 401: Errors, 403: Errors, 404: Errors, 409: Errors},
    summary="Silence a firing alert for a stated time, with a reason: it does not age",
)
def alert_silence_post(request: HttpRequest, alert_id: int, payload: SilenceIn):
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        attempt_hidden_record(
            user=request.user, action=AuditAction.ALERT_SILENCE, target=f"alert:{alert_id}",
            clusters=Cluster.objects.filter(alerts__pk=alert_id), request=request,
        )  # fmt: skip
        raise FieldError(404, "alert_id", "no such alert")
    if not alert_silence_authorize(
        user=request.user, alert=alert, reason=payload.reason, request=request
    ):
        raise FieldError(403, "", "you may not silence this cluster's alerts")
    try:
        silenced = alert_silence(
            alert=alert, user=request.user, minutes=payload.minutes, reason=payload.reason,
            request=request,
        )  # fmt: skip
    except AlertNotFiring as error:
        raise FieldError(409, "state", str(error)) from None
    return alert_json(alert_get(alert_id=silenced.pk))
