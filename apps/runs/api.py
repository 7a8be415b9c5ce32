from django.http import HttpRequest
from ninja import Field, Router, Schema

from apps.access.auth import reader_auth
from apps.access.selectors import request_cluster_filter
from apps.core.errors import Errors, FieldError
from apps.core.openapi import ALERTS, COMMANDS, NODE_SERIES, PLAN, link, links
from apps.runs.selectors import run_get, run_summary

router = Router(tags=["reading back"])


class CheckpointAt(Schema):
    step: int | None
    at: float


class CheckpointOut(Schema):
    local: CheckpointAt | None
    durable: CheckpointAt | None
    work_at_risk_gpu_hours: float | None


class GoodputOut(Schema):
    """detectors.goodput.Goodput.to_dict(): seconds since `start` and shares of the wall."""

    start: float
    wall_s: float
    productive_s: float
    goodput: float
    badput_s: dict[str, float] = Field(
        description="seconds of data, checkpoint, recovery (a restart to the next step, and "
        "the steps it threw away: those past the checkpoint it resumed from), hang and idle"
    )
    badput: dict[str, float] = Field(description="badput_s as shares of wall_s")


class RunOut(Schema):
    run: str
    state: str
    ranks: int
    last_step: int | None
    last_step_at: float | None
    restarts: int = Field(
        0,
        description="restarts, each once: every restart event, and every time the step "
        "counter went back (a resume, a resubmitted job) that no event stands for",
    )
    timeline_after: float | None = Field(
        None,
        description="the newest report before the latest restart: last_step and the "
        "detectors follow the reports after it (null: no restart)",
    )
    tokens_per_s: float | None = Field(
        None,
        description="all ranks' tokens a second over the steps completed in the minute "
        "before the newest report (from each step's median end; null with fewer than two)",
    )
    goodput: GoodputOut | None
    checkpoint: CheckpointOut
    nodes: list[str]


@router.get(
    "/runs/{name}",
    auth=reader_auth,
    response={200: RunOut, 400: Errors, 401: Errors, 404: Errors},
    openapi_extra=links(
        (200,),
        Plan=link(
            PLAN, "its restart plan", name="$response.body#/run", cluster="$request.query.cluster"
        ),
        Alerts=link(
            ALERTS, "its alerts", run="$response.body#/run", cluster="$request.query.cluster"
        ),
        Commands=link(
            COMMANDS, "its commands", run="$response.body#/run", cluster="$request.query.cluster"
        ),
        Node=link(
            NODE_SERIES,
            "its first node's series",
            name="$response.body#/nodes/0",
            cluster="$request.query.cluster",
        ),
    ),
)
def run_detail(request: HttpRequest, name: str, cluster: str | None = None):
    run = run_get(name=name, **request_cluster_filter(request, cluster))
    if run is None:
        raise FieldError(404, "name", "no such run")
    return run_summary(run=run)
