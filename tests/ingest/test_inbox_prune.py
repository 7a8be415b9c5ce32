"""Processed inbox rows go once their batch_id can no longer matter; the rest stay."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.services import token_issue
from apps.ingest import schemas
from apps.ingest.models import InboxBatch
from apps.ingest.schemas import FUTURE_LIMIT_S, BatchRejected
from apps.ingest.services.prune import INBOX_KEEP, inbox_prune
from apps.ingest.validation import batch_validate
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def test_old_processed_rows_go_and_recent_unprocessed_or_quarantined_rows_stay(settings):
    settings.HISTORY_PRUNE_BATCH = 2  # several transactions
    token = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="prune")[0]
    now = timezone.now()
    old, recent = now - INBOX_KEEP - timedelta(minutes=1), now - INBOX_KEEP + timedelta(hours=1)
    rows = {}
    for name, received, processed, quarantined in [
        ("old-1", old, True, False),
        ("old-2", old, True, False),
        ("old-3", old, True, False),
        ("old-quarantined", old, True, True),
        ("old-unprocessed", old, False, False),
        ("recent", recent, True, False),
    ]:
        rows[name] = InboxBatch.objects.create(
            token=token,
            batch_id=name,
            payload=b"{}",
            processed_at=received if processed else None,
            quarantined_at=received if quarantined else None,
        )
        InboxBatch.objects.filter(pk=rows[name].pk).update(received_at=received)

    assert inbox_prune(now=now) == 3

    left = set(InboxBatch.objects.filter(token=token).values_list("batch_id", flat=True))
    assert left == {"old-quarantined", "old-unprocessed", "recent"}


def test_a_batch_sent_again_after_its_row_went_is_refused_not_stored_twice(monkeypatch):
    """Why pruning is safe: a batch accepted at T holds no record newer than T + 5 minutes;
    from T + INBOX_KEEP on, all of them are older than the ts window allows."""
    accepted_at = time.time()
    newest = accepted_at + FUTURE_LIMIT_S
    body = make_batch(samples=2, steps=1, run="run-1")
    for record in body["samples"] + body["steps"]:
        record["ts"] = newest
    batch_validate(json.dumps(body).encode())  # accepted at T

    monkeypatch.setattr(schemas.time, "time", lambda: accepted_at + INBOX_KEEP.total_seconds())
    with pytest.raises(BatchRejected) as refused:
        batch_validate(json.dumps(body).encode())
    assert {e["msg"] for e in refused.value.errors} == {"more than 7 days in the past"}
