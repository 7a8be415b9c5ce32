import time

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from apps.clusters.models import Node
from apps.ingest.auth import reader_auth
from apps.ingest.schemas import Errors
from apps.telemetry.selectors import metric_id_get, series_read
from opsboard.errors import FieldError

router = Router(tags=["reading back"])

DEFAULT_RANGE_S = 3600


class SeriesQuery(Schema):
    node: str = Field(min_length=1)
    metric: str = Field(min_length=1, max_length=128)
    gpu: int | None = Field(default=None, ge=0)
    start: float | None = None
    end: float | None = None
    step: float = Field(default=0, ge=0, description="bucket seconds; 0: raw points")
    cluster: str | None = Field(default=None, description="for a logged-in user")


class SeriesOut(Schema):
    node: str
    metric: str
    gpu: int | None
    step: float
    points: list[list[float]]


def request_cluster_filter(request: HttpRequest, cluster: str | None) -> dict:
    """The cluster a reader may see: its token's, or (for a user) the named one, if any."""
    token = getattr(request, "agent_token", None)
    if token is not None:
        return {"cluster_id": token.cluster_id}
    return {"cluster__name": cluster} if cluster else {}


@router.get("/series", auth=reader_auth, response={200: SeriesOut, 400: Errors, 404: Errors})
def series(request: HttpRequest, query: Query[SeriesQuery]):
    end = query.end if query.end is not None else time.time()
    start = query.start if query.start is not None else end - DEFAULT_RANGE_S
    if start >= end:
        raise FieldError(400, "start", "must be before end")
    if query.step and (end - start) / query.step > 100_000:
        raise FieldError(400, "step", "too small for the range: over 100,000 buckets")
    nodes = list(
        Node.objects.filter(
            name=query.node, **request_cluster_filter(request, query.cluster)
        ).values_list("id", flat=True)[:2]
    )
    if len(nodes) != 1:
        raise FieldError(
            404 if not nodes else 400,
            "node",
            "no such node" if not nodes else "in several clusters: name the cluster",
        )
    metric_id = metric_id_get(name=query.metric)
    points = (
        []
        if metric_id is None
        else series_read(
            node_id=nodes[0],
            metric_id=metric_id,
            gpu=query.gpu,
            start=start,
            end=end,
            step=query.step,
        )
    )
    return {
        "node": query.node,
        "metric": query.metric,
        "gpu": query.gpu,
        "step": query.step,
        "points": points,
    }
