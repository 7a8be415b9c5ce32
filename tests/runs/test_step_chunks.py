"""Step reports compacted into per-rank columnar chunks: the round trip, late data into a
compacted window, replay, pruning, and every reader of older reports answering the same
before and after compaction. Through the real ingest path (view, inbox, store)."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.clusters.services import token_issue
from apps.commands.plan import run_plan
from apps.commands.selectors import checkpoint_ranks, run_serving_node_names
from apps.dashboard.selectors.runs import checksum_agreement, run_began
from apps.history.selectors import run_rank_history
from apps.history.services import history_prune, rollups_refresh
from apps.ingest.services import inbox_drain
from apps.runs.chunks import (
    DURATION_FIELDS,
    FORMAT_VERSION,
    STEP_FIELDS,
    chunk_decode,
    chunk_encode,
)
from apps.runs.compaction import keep_steps, steps_compact
from apps.runs.models import Run, StepChunk, StepReport
from apps.runs.selectors import rank_stage_history, run_summary, step_reports
from tests.runs.test_step_chunk_format import v1_edge_rows

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest"
RANKS = 3
STEPS = 400  # steps 0..199 lie outside the last STEP_COMPACT_KEEP_STEPS (200): compactable
COMPACTED = 200
STEP_S = 10.0
CHECK_EVERY = 7


@pytest.fixture
def token():
    return token_issue(cluster_name="alpha", name="t")


@pytest.fixture
def base() -> float:
    """The first step's time: 3 h ago, whole windows before the compaction cutoff."""
    return (time.time() - 3 * 3600) // 600 * 600


def post(client: Client, secret: str, body: dict) -> None:
    response = client.post(
        URL, json.dumps(body).encode(), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )  # fmt: skip
    assert response.status_code in (200, 202)  # 200: a batch the server already has
    inbox_drain(first_id=None, limit=100)


def report(base: float, rank: int, step: int) -> dict:
    out = {
        "ts": base + step * STEP_S + rank * 0.001237,
        "rank": rank,
        "step": step,
        "step_time": 1.0 + math.sin(step + rank) / 7,
        "data_time": 0.05 + rank / 1000,
        "compute_time": 0.61 + step / 1e5,
        "comm_wait": 0.2 + math.cos(step) / 9,
        "tokens": 4096,
        "loss": 2.0 + 8.0 / (10 + step),
        "shard": f"s{rank // 4}",
        "gpu": rank,
    }
    if step % 3:  # optional phases left out now and then: nulls
        out["h2d_time"] = 0.01 + step / 1e6
    if step % CHECK_EVERY == 0:
        flipped = rank == 2 and step == 70
        out["grad_checksum"] = ("ff" if flipped else "ab") * 16 + f"{step:032x}"
        out["param_checksum"] = f"{step:064x}"
        out["canary"] = {"norm": 3.5 + step / 1000, "proj": [0.1 * rank, -1e-7, step / 3]}
    return out


def steps_batch(base: float, steps: range, ranks: range = range(RANKS)) -> dict:
    return {
        "batch_id": uuid.uuid4().hex,
        "node": "node-01",
        "run": "run-1",
        "steps": [report(base, rank, step) for step in steps for rank in ranks],
    }


def seed(client: Client, secret: str, base: float) -> list[dict]:
    batches = [steps_batch(base, range(first, first + 50)) for first in range(0, STEPS, 50)]
    for batch in batches:
        post(client, secret, batch)
    rollups_refresh()  # a window waiting for the rollup pass is not compacted
    return batches


def all_reports(run: Run) -> Counter:
    rows = step_reports(run_id=run.id, fields=tuple(STEP_FIELDS))
    return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r.values()) for r in rows)


def compact() -> int:
    return steps_compact(now=timezone.now())


def test_it_round_trips_reports_through_chunks_exactly(client, token, base):
    seed(client, token[1], base)
    assert STEPS - keep_steps() == COMPACTED
    run = Run.objects.get()
    before = all_reports(run)
    raw_before = StepReport.objects.count()

    moved = compact()

    assert moved == COMPACTED * RANKS
    assert StepReport.objects.count() == raw_before - moved
    chunks = StepChunk.objects.filter(run=run)
    assert {c.rank for c in chunks} == set(range(RANKS))
    assert sum(c.n for c in chunks) == moved
    assert all_reports(run) == before  # nulls, checksums, canary arrays, gpu, shard
    assert compact() == 0  # nothing left to move
    assert {bytes(c.data)[0] for c in chunks} == {FORMAT_VERSION}
    stored = step_reports(run_id=run.id, fields=DURATION_FIELDS)
    assert all(round(v, 6) == v for r in stored for v in r.values() if v is not None)


def test_it_stores_durations_to_the_microsecond_and_other_floats_as_sent(client, token, base):
    sent = {
        "ts": base, "rank": 0, "step": 1, "step_time": 0.1234567891, "data_time": 4e-7,
        "h2d_time": 2, "compute_time": 0.0300004, "comm_wait": 9_999_999.9999996,
        "loss": 0.1234567891, "canary": {"norm": 0.1234567891, "proj": [0.1234567891]},
    }  # fmt: skip
    post(client, token[1], {"batch_id": "b1", "node": "n", "run": "r", "steps": [sent]})

    stored = StepReport.objects.values().get()
    assert (stored["step_time"], stored["data_time"], stored["h2d_time"]) == (0.123457, 0.0, 2.0)
    assert (stored["compute_time"], stored["comm_wait"]) == (0.03, 10_000_000.0)
    assert stored["loss"] == stored["canary_norm"] == 0.1234567891
    assert stored["canary_proj"] == [0.1234567891]
    rollups_refresh()  # what the rollups (step charts, detectors' history) derive: the same
    with connection.cursor() as cursor:
        cursor.execute("SELECT step_time_sum, step_time_max FROM history_step_10s")
        assert cursor.fetchall() == [(0.123457, 0.123457)]


def test_it_merges_a_late_report_into_its_compacted_window_once(client, token, base):
    seed(client, token[1], base)
    run = Run.objects.get()
    compact()
    before = all_reports(run)
    late = steps_batch(base, range(40, 42), ranks=range(RANKS, RANKS + 1))  # a 4th rank, late

    post(client, token[1], late)

    # its window's chunks became raw again (all ranks: the rollups recompute from raw)
    assert StepReport.objects.filter(run=run, step__lt=COMPACTED).count() > 2
    assert all_reports(run) - before == Counter(all_reports(run) - before)
    assert sum((all_reports(run) - before).values()) == 2
    rollups_refresh()
    compact()
    after = all_reports(run)
    assert sum(after.values()) == sum(before.values()) + 2
    assert max(after.values()) == 1  # no report twice
    assert not StepReport.objects.filter(run=run, step__lt=COMPACTED).exists()


def test_it_stores_nothing_twice_when_a_batch_is_replayed_after_compaction(client, token, base):
    batches = seed(client, token[1], base)
    run = Run.objects.get()
    compact()
    before = all_reports(run)

    post(client, token[1], batches[0])  # the agent resends a batch the server already has
    rollups_refresh()
    compact()

    assert all_reports(run) == before


def test_it_prunes_chunks_past_the_raw_retention(client, token, base, settings):
    seed(client, token[1], base)
    compact()
    assert StepChunk.objects.exists()
    settings.HISTORY_RAW_RETENTION_DAYS = 1

    history_prune(now=timezone.now() + timedelta(days=1, hours=1))

    assert not StepChunk.objects.exists()
    assert not StepReport.objects.exists()


def readers(run: Run, base: float) -> dict:
    run.refresh_from_db()
    start, end = base - 60, base + STEPS * STEP_S + 60
    return {
        "checksums": checksum_agreement(run=run, start=start, end=end),
        "rank_stages": rank_stage_history(run=run, rank=2, start=start, end=end, buckets=40),
        "began": run_began(run),
        "plan": run_plan(run=run),
        "serving": sorted(run_serving_node_names(run_id=run.id)),
        "checkpoint": checkpoint_ranks(run_id=run.id, step=70),
        "rank_history": run_rank_history(
            run_id=run.id, start=start, end=end, max_points=60
        ).to_dict(),
        "nodes": run_summary(run=run, now=end)["nodes"],
    }


def test_its_readers_answer_the_same_before_and_after_compaction(client, token, base):
    seed(client, token[1], base)
    run = Run.objects.get()
    before = readers(run, base)
    assert any(row["grad"] == [2] for row in before["checksums"])  # something to compare
    assert before["rank_stages"]["ts"]

    assert compact() > 0

    after = readers(run, base)
    # the rank page's means are rounded to 6 digits: summing in another row order may move
    # one across a rounding boundary
    stages_before, stages_after = before.pop("rank_stages"), after.pop("rank_stages")
    assert after == before
    assert stages_after["ts"] == stages_before["ts"]
    for side in ("rank", "median"):
        for stage, values in stages_before[side].items():
            assert stages_after[side][stage] == pytest.approx(values, abs=2e-6)


def test_its_fine_step_charts_read_the_rollups_once_a_range_is_compacted(client, token, base):
    seed(client, token[1], base)
    run = Run.objects.get()
    start, end = base, base + 100 * STEP_S  # compacted steps 0..99
    assert run_rank_history(run_id=run.id, start=start, end=end).resolution_s == 1  # raw

    compact()

    history = run_rank_history(run_id=run.id, start=start, end=end)
    assert history.resolution_s == 10  # the 10 s tier: the rollups hold every report
    assert history.ranks == list(range(RANKS))
    assert sum(v is not None for v in history.step_time[0]) == 100


def test_it_reads_only_the_bounds_asked_for_from_chunks(client, token, base):
    seed(client, token[1], base)
    run = Run.objects.get()
    compact()
    start = datetime.fromtimestamp(base + 50 * STEP_S, UTC)
    end = datetime.fromtimestamp(base + 60 * STEP_S, UTC)

    rows = step_reports(run_id=run.id, fields=("step", "rank"), start=start, end=end)

    assert [(r["step"], r["rank"]) for r in rows] == [
        (step, rank) for step in range(50, 60) for rank in range(RANKS)
    ]


def test_the_chunk_format_keeps_edge_values():
    rows = v1_edge_rows()  # the same reports the format-1 capture holds

    decoded = chunk_decode(chunk_encode(rows), run_id=1, rank=0)

    assert [repr(sorted(r.items())) for r in decoded] == [repr(sorted(r.items())) for r in rows]
