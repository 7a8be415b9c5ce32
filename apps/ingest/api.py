from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, JsonResponse
from ninja import Router, Status

from apps.core.auth import NODE_NOT_OURS, agent_auth
from apps.core.counters import counter_add
from apps.core.errors import Errors, FieldError, error_response
from apps.ingest.middleware import REMOTE_WRITE_SAMPLES
from apps.ingest.prompb import WireError, snappy_decode, write_request_decode
from apps.ingest.ratelimit import ingest_rate_take
from apps.ingest.schemas import IngestAccepted, IngestDuplicate, RemoteWriteAnswer
from apps.ingest.services import batch_accept
from apps.ingest.services.backpressure import backlog_wait
from apps.ingest.services.remote_write import remote_write_accept
from apps.ingest.validation import batch_validate

router = Router(tags=["ingest"])

# The body is parsed straight from JSON (in Rust), not by ninja's json.loads +
# validate_python: a third of the cost on the hot path (apps.ingest.validation). The schema
# is documented here and registered in the components by opsboard.api.
BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
    }
}


@router.post(
    "/ingest",
    auth=agent_auth,
    response={
        202: IngestAccepted,
        200: IngestDuplicate,
        400: Errors,
        401: Errors,
        403: Errors,
        413: Errors,
        429: Errors,
        503: Errors,
    },
    summary="Post one batch of telemetry, step reports and events from one node",
    openapi_extra=BODY_DOC,
)
def ingest(request: HttpRequest):
    """202 means the batch is committed to the Postgres inbox: it will be stored exactly once."""
    # After auth (the bucket is the token's), before the body is parsed (the cost we spare).
    wait = ingest_rate_take(token_id=request.agent_token.id)
    if wait:
        return _rate_limited(wait)
    batch = batch_validate(request.body)
    if not request.agent_token.acts_for(batch.node):
        raise FieldError(403, "node", NODE_NOT_OURS)
    if isinstance(request, WSGIRequest):
        # bad input is answered at once; a good batch waits while the workers catch up. Not
        # under ASGI, where sync views share one thread: a wait there would hold them all.
        backlog_wait()
    wire_body = getattr(request, "ingest_wire_body", None)
    inbox_id = batch_accept(
        token=request.agent_token,
        batch_id=batch.batch_id,
        payload=wire_body or request.body,
        encoding="gzip" if wire_body else "identity",
    )
    if inbox_id is None:
        return Status(200, {"batch_id": batch.batch_id, "duplicate": True})
    accepted = {"samples": batch.samples, "steps": batch.steps, "events": batch.events}
    return Status(202, {"batch_id": batch.batch_id, "accepted": accepted})


def _rate_limited(wait: int):
    response = error_response(
        429,
        [{"loc": "Authorization", "msg": "this token sends more batches than its rate limit"}],
    )
    response["Retry-After"] = str(wait)
    return response


WRITE_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "A snappy-compressed (block format) protobuf prometheus.WriteRequest",
        "content": {"application/x-protobuf": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "/write",
    auth=agent_auth,
    response={
        202: RemoteWriteAnswer,
        200: RemoteWriteAnswer,
        400: Errors,
        401: Errors,
        413: Errors,
        415: Errors,
        429: Errors,
        503: Errors,
    },
    summary="Prometheus remote write 1.0: series from a Prometheus, as the agent's samples",
    openapi_extra=WRITE_BODY_DOC,
)
def remote_write(request: HttpRequest):
    """202: what was new is committed to the inbox (stored exactly once); 200: nothing new
    (a request sent again, or samples accepted before); 400: nothing in it can be stored
    (Prometheus does not retry a 4xx). Series refused one by one are counted and named in a
    2xx answer, with why (docs/contract.md, "Prometheus remote write")."""
    wait = ingest_rate_take(token_id=request.agent_token.id)
    if wait:
        return _rate_limited(wait)
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "snappy").strip().lower()
    if encoding != "snappy":
        raise FieldError(415, "Content-Encoding", f"snappy expected, not {encoding!r}")
    limit = settings.INGEST_MAX_BODY_BYTES
    if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
        raise FieldError(413, "body", f"body over {limit} bytes")
    try:
        write = write_request_decode(snappy_decode(request.body, limit))
    except WireError as exc:
        raise FieldError(400, "body", str(exc)) from exc
    if isinstance(request, WSGIRequest):
        backlog_wait()  # as the ingest endpoint: a good request waits while workers catch up
    outcome = remote_write_accept(token=request.agent_token, body=request.body, request=write)
    for name, count in (
        ("accepted", outcome.samples),
        ("replayed", outcome.replayed),
        ("dropped", outcome.dropped),
        ("refused", outcome.refused_samples),
    ):
        if count:
            counter_add(REMOTE_WRITE_SAMPLES, {"outcome": name}, count)
    if outcome.duplicate:
        return Status(200, outcome.body())
    if outcome.refused_series and not (outcome.batches or outcome.replayed or outcome.dropped):
        errors = [{"loc": e["series"], "msg": e["reason"]} for e in outcome.examples]
        return JsonResponse({"errors": errors, **outcome.body()}, status=400)
    return Status(202 if outcome.batches else 200, outcome.body())
