"""What the fault tests share: a large ingest posted from a thread, and exact row counts.

Every figure a test measures is printed (`-s` shows them; docs/faults.md quotes them)."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from apps.ingest.models import InboxBatch
from apps.runs.models import StepReport
from apps.telemetry.selectors import chunk_storage
from tests.conftest import AgentClient, make_batch

# one line per request would bury the figures that `make faults -s` prints
logging.getLogger("httpx").setLevel(logging.WARNING)

# `make faults` ingests a million samples; a quicker run sets FAULTS_SAMPLES lower.
SAMPLES_TOTAL = int(os.environ.get("FAULTS_SAMPLES", "1000000"))
SAMPLES_PER_BATCH, STEPS_PER_BATCH, NODES = 2_000, 8, 8


def batch_count() -> int:
    return max(10, SAMPLES_TOTAL // SAMPLES_PER_BATCH)


def unprocessed(token) -> int:
    return InboxBatch.objects.filter(token=token, processed_at__isnull=True).count()


def fault_batch(prefix: str, index: int) -> dict:
    return make_batch(
        batch_id=f"{prefix}-{index}",
        node=f"node-{index % NODES}",
        samples=SAMPLES_PER_BATCH,
        steps=STEPS_PER_BATCH,
        run="faults",
    )


@dataclass
class Sender:
    """Posts `count` batches in order from a thread, each until the server answers 202, or
    200 duplicate for a batch an earlier try delivered (a 503 or 429 is retried after its
    Retry-After, at most `attempts` times in all)."""

    agent: AgentClient
    count: int
    prefix: str
    attempts: int = 200
    pace_s: float = 0.0  # seconds between batches (0: as fast as the server answers)
    accepted: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    error: BaseException | None = None
    longest_s: float = 0.0  # the longest request, answered or not
    no_retry_after: int = 0  # 429s and 503s without a Retry-After header

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sender:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for index in range(self.count):
                self._post(fault_batch(self.prefix, index))
                time.sleep(self.pace_s)
        except BaseException as error:  # reported by join()
            self.error = error

    def _post(self, batch: dict) -> None:
        unanswered = False  # an attempt got no answer: the server may have the batch
        for _ in range(self.attempts):
            started = time.monotonic()
            try:
                response = self.agent.post(batch, gzip_body=True)
            except Exception:  # the connection itself failed: an agent retries
                self._took(started)
                self.statuses[0] = self.statuses.get(0, 0) + 1
                unanswered = True
                time.sleep(0.5)
                continue
            self._took(started)
            status = response.status_code
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 202 or (status == 200 and unanswered):
                # a 200 duplicate after an unanswered attempt: that attempt's 202 was lost
                self.accepted.append(batch["batch_id"])
                return
            assert status in (429, 503), (status, response.text)
            if "Retry-After" not in response.headers:
                self.no_retry_after += 1
            time.sleep(min(float(response.headers.get("Retry-After", "1")), 2.0))
        raise AssertionError(f"{batch['batch_id']} never accepted")

    def _took(self, started: float) -> None:
        self.longest_s = max(self.longest_s, time.monotonic() - started)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the sender did not finish in {timeout} s"
        if self.error:
            raise self.error


def assert_stored_exactly_once(token, batch_ids: list[str]) -> None:
    """Every accepted batch has one inbox row, processed, and its rows are stored once."""
    assert len(set(batch_ids)) == len(batch_ids)
    inbox = InboxBatch.objects.filter(token=token)
    assert sorted(inbox.values_list("batch_id", flat=True)) == sorted(batch_ids)
    assert unprocessed(token) == 0
    assert chunk_storage()["samples"] == len(batch_ids) * SAMPLES_PER_BATCH
    assert StepReport.objects.count() == len(batch_ids) * STEPS_PER_BATCH
