from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest
from ninja import Router, Status

from apps.core.auth import NODE_NOT_OURS, agent_auth
from apps.core.errors import Errors, FieldError, error_response
from apps.ingest.ratelimit import ingest_rate_take
from apps.ingest.schemas import IngestAccepted, IngestDuplicate
from apps.ingest.services import batch_accept
from apps.ingest.services.backpressure import backlog_wait
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
