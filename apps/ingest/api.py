from django.http import HttpRequest
from ninja import Router, Status

from apps.ingest.auth import agent_auth
from apps.ingest.schemas import Errors, IngestAccepted, IngestBatch, IngestDuplicate
from apps.ingest.services import batch_accept

router = Router(tags=["ingest"])


@router.post(
    "/ingest",
    auth=agent_auth,
    response={202: IngestAccepted, 200: IngestDuplicate, 400: Errors, 401: Errors, 413: Errors,
              503: Errors},
    summary="Post one batch of telemetry, step reports and events from one node",
)
def ingest(request: HttpRequest, batch: IngestBatch):
    """202 means the batch is committed to the Postgres inbox: it will be stored exactly once."""
    inbox_id = batch_accept(token=request.agent_token, batch_id=batch.batch_id, payload=request.body)
    if inbox_id is None:
        return Status(200, {"batch_id": batch.batch_id, "duplicate": True})
    accepted = {
        "samples": len(batch.samples), "steps": len(batch.steps), "events": len(batch.events)
    }
    return Status(202, {"batch_id": batch.batch_id, "accepted": accepted})
