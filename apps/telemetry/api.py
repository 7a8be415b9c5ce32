import time
from typing import Any

from django.db.models import Subquery
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from apps.access.auth import reader_auth
from apps.access.selectors import node_only, nodes_visible_named
from apps.core.bounds import GPU_MAX, METRIC_MAX_LENGTH, NAME_MAX_LENGTH
from apps.core.db_router import replica_reads
from apps.core.errors import Errors, FieldError
from apps.core.openapi import ALERTS, NODE_SERIES, SERIES, link, links
from apps.core.params import CLUSTER_MAX_LENGTH, timestamp_field
from apps.telemetry.models import Metric
from apps.telemetry.selectors import (
    SOURCE_PATTERN,
    metric_of,
    node_series_list,
    series_grouped,
    series_known,
    series_read,
    source_known,
)

router = Router(tags=["reading back"])

DEFAULT_RANGE_S = 3600
# Read bounds: a bucket no wider than a year (timestamps: apps.core.params).
STEP_MAX_S = 366 * 86_400


def source_field() -> Any:
    return Field(
        default=None, min_length=1, max_length=METRIC_MAX_LENGTH, pattern=SOURCE_PATTERN,
        description="scrape target name: its series are stored as `<source>:<metric>`",
    )  # fmt: skip


class SeriesQuery(Schema):
    node: str = Field(min_length=1, max_length=NAME_MAX_LENGTH)
    metric: str = Field(min_length=1, max_length=METRIC_MAX_LENGTH)
    gpu: int | None = Field(default=None, ge=0, le=GPU_MAX)
    source: str | None = source_field()
    start: float | None = timestamp_field()
    end: float | None = timestamp_field()
    step: float = Field(
        default=0, ge=0, le=STEP_MAX_S, allow_inf_nan=False,
        description="bucket seconds; 0: raw points",
    )  # fmt: skip
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )


class SeriesOut(Schema):
    node: str
    metric: str
    source: str | None
    gpu: int | None
    step: float
    points: list[list[float]]


def _node_id(request: HttpRequest, name: str, cluster: str | None) -> int:
    """The id of the node `name` the reader may see; 404/400 naming `node` otherwise."""
    nodes = nodes_visible_named(request, name, cluster)
    return node_only(list(nodes.values_list("id", flat=True)[:2]))


def _node_and_metric_ids(
    request: HttpRequest, query: SeriesQuery, metric: str
) -> tuple[int, int | None]:
    """(node id as `_node_id` finds it, the metric's id or None), in one round trip: under
    load every round trip of a chart read waits for a core again."""
    metric_id = Subquery(Metric.objects.filter(name=metric).values("id")[:1])
    nodes = nodes_visible_named(request, query.node, query.cluster).annotate(metric_id=metric_id)
    return node_only(list(nodes.values_list("id", "metric_id")[:2]))


def _unknown_series(node_id: int, query: SeriesQuery) -> FieldError:
    """A 404 naming what the node never sent: the source, or the metric (on that GPU)."""
    if query.source and not source_known(node_id=node_id, source=query.source):
        return FieldError(404, "source", f"node {query.node} sent nothing from {query.source}")
    where = f" for GPU {query.gpu}" if query.gpu is not None else ""
    return FieldError(404, "metric", f"node {query.node} never sent {query.metric}{where}")


@router.get(
    "/series",
    auth=reader_auth,
    response={200: SeriesOut, 400: Errors, 401: Errors, 404: Errors},
    openapi_extra=links(
        (200,),
        Node=link(
            NODE_SERIES,
            "every series of its node",
            name="$response.body#/node",
            cluster="$request.query.cluster",
        ),
    ),
)
@replica_reads
def series(request: HttpRequest, query: Query[SeriesQuery]):
    end = query.end if query.end is not None else time.time()
    start = query.start if query.start is not None else end - DEFAULT_RANGE_S
    if start >= end:
        raise FieldError(400, "start", "must be before end")
    if query.step and (end - start) / query.step > 100_000:
        raise FieldError(400, "step", "too small for the range: over 100,000 buckets")
    metric = metric_of(source=query.source, name=query.metric)
    node_id, metric_id = _node_and_metric_ids(request, query, metric)
    if metric_id is None:
        raise _unknown_series(node_id, query)
    points = series_read(
        node_id=node_id, metric_id=metric_id, gpu=query.gpu, start=start, end=end, step=query.step
    )
    # An empty range of a series the node sends is an answer; a series it never sent is not.
    if not points and not series_known(
        node_id=node_id, metric=metric, metric_id=metric_id, gpu=query.gpu
    ):
        raise _unknown_series(node_id, query)
    return {
        "node": query.node,
        "metric": query.metric,
        "source": query.source,
        "gpu": query.gpu,
        "step": query.step,
        "points": points,
    }


class SourceOut(Schema):
    source: str | None = Field(description="scrape target; null: core and agent metrics")
    series: int


class SeriesKeyOut(Schema):
    metric: str = Field(description="the stored name, `<source>:<name>` for scraped series")
    source: str | None
    name: str
    gpu: int | None


class NodeSeriesQuery(Schema):
    source: str | None = source_field()
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )


class NodeSeriesOut(Schema):
    node: str
    sources: list[SourceOut]
    series: list[SeriesKeyOut]


@router.get(
    "/nodes/{name}/series",
    auth=reader_auth,
    response={200: NodeSeriesOut, 400: Errors, 401: Errors, 404: Errors},
    openapi_extra=links(
        (200,),
        Series=link(
            SERIES,
            "the first series' points",
            node="$response.body#/node",
            metric="$response.body#/series/0/metric",
            gpu="$response.body#/series/0/gpu",
            cluster="$request.query.cluster",
        ),
        Alerts=link(
            ALERTS, "its alerts", node="$response.body#/node", cluster="$request.query.cluster"
        ),
    ),
)
@replica_reads
def node_series(request: HttpRequest, name: str, query: Query[NodeSeriesQuery]):
    """Every series the node has sent: the sources with their counts, and the series (of
    `source` only, when given)."""
    node_id = _node_id(request, name, query.cluster)
    grouped = series_grouped(series=node_series_list(node_id=node_id), source=query.source)
    if query.source and not grouped["series"]:
        raise FieldError(404, "source", f"node {name} sent nothing from {query.source}")
    return {"node": name, **grouped}
