"""A periodic worker keeps each cluster's step window between passes and reads only the
steps that changed (apps.alerts.selectors.kept, apps.runs.changes): the window it hands the
detectors is the one a whole load gives, whatever arrived, late, twice or out of order."""

import time
from datetime import UTC, datetime

import pytest
from django.test import override_settings

from apps.alerts.selectors import cluster_window
from apps.alerts.selectors.kept import KeptWindow
from apps.alerts.services import alerts_evaluate
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store
from apps.runs.changes import step_changes_prune
from apps.runs.models import Run
from detectors import detect_all
from detectors.common import by_step
from tests.alerts.held_writer import held_open

WINDOW = 20


def store(cluster: Cluster, node: str, steps: list[dict], key: str, run: str = "llama") -> None:
    body = {"batch_id": key, "node": node, "run": run, "steps": steps}
    batches_store(
        batches=[ClaimedBatch.of(cluster_id=cluster.pk, received_at=datetime.now(UTC), body=body)]
    )


def reports(ranks: range, numbers: range, t0: float, slow: int | None = None) -> list[dict]:
    return [
        {
            "ts": t0 + number,
            "rank": rank,
            "step": number,
            "step_time": 1.0,
            "compute_time": 0.9 * (1.5 if rank == slow else 1.0),
            "data_time": 0.02,
        }
        for number in numbers
        for rank in ranks
    ]


def assert_same_as_whole(cluster: Cluster, kept: KeptWindow, now: float) -> tuple:
    """The kept window equals a whole load, grouped as common.by_step would group it (its
    telemetry too: tests/alerts/test_kept_telemetry.py)."""
    kept_window = cluster_window(cluster=cluster, now=now, kept=kept)
    whole = cluster_window(cluster=cluster, now=now)
    assert [r.run for r in kept_window.runs] == [r.run for r in whole.runs]
    assert kept_window.telemetry == whole.telemetry
    for mine, theirs in zip(kept_window.runs, whole.runs, strict=True):
        assert mine.steps == theirs.steps
        assert mine.by_step == by_step(theirs.steps)
        assert list(mine.by_step) == sorted(mine.by_step)
    return kept_window, whole


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="kept")


# Transactional: inside a test's one transaction every change is its own, and a reader reads
# again all the changes of transactions still running (its own included).
@override_settings(ALERT_STEP_WINDOW=WINDOW)
@pytest.mark.django_db(transaction=True)
def test_it_reads_only_what_changed_and_matches_a_whole_load(cluster):
    t0 = time.time() - 100
    store(cluster, "node-01", reports(range(0, 2), range(0, 30), t0), "a")
    store(cluster, "node-02", reports(range(2, 4), range(0, 30), t0), "b")
    kept = KeptWindow()
    first, _ = assert_same_as_whole(cluster, kept, t0 + 40)
    assert 14 in first.runs[0].by_step
    run_id = Run.objects.get(name="llama").pk
    unchanged = kept.runs[run_id].groups[15]
    # new steps, a late report of an old step in the window, a report sent twice
    store(cluster, "node-01", reports(range(0, 2), range(30, 35), t0), "c")
    store(cluster, "node-02", reports(range(2, 4), range(30, 34), t0), "d")
    late = reports(range(3, 4), range(26, 27), t0)[0]  # within RESTART_STEPS: not a restart
    store(cluster, "node-02", [{**late, "ts": t0 + 50}], "e")
    store(cluster, "node-01", reports(range(1, 2), range(33, 34), t0 + 0.5), "f")
    window, _ = assert_same_as_whole(cluster, kept, t0 + 45)
    groups = kept.runs[run_id].groups
    assert groups[15] is unchanged  # not read again: the detectors' results for it carry over
    assert min(groups) == 35 - WINDOW and len(groups[26]) == 5 and len(groups[33]) == 5
    assert 14 not in groups  # fell out of the window


@override_settings(ALERT_STEP_WINDOW=WINDOW)
@pytest.mark.django_db(transaction=True)
def test_it_loads_whole_after_a_restart_or_a_prune(cluster):
    t0 = time.time() - 100
    store(cluster, "node-01", reports(range(0, 2), range(0, 30), t0), "a")
    kept = KeptWindow()
    assert_same_as_whole(cluster, kept, t0 + 40)
    run_id = Run.objects.get(name="llama").pk
    before = kept.runs[run_id].groups[20]
    store(cluster, "node-01", reports(range(0, 2), range(30, 31), t0 + 0.1), "a2")
    assert_same_as_whole(cluster, kept, t0 + 40)
    assert kept.runs[run_id].groups[20] is before  # kept while the log holds the changes
    step_changes_prune(keep_s=0)  # what was read already: nothing a kept window needs
    assert_same_as_whole(cluster, kept, t0 + 40)
    assert kept.runs[run_id].groups[20] is before
    store(cluster, "node-01", reports(range(0, 2), range(31, 32), t0), "b")
    step_changes_prune(keep_s=0)  # the log lost a change this window has not read
    window, _ = assert_same_as_whole(cluster, kept, t0 + 41)
    assert kept.runs[run_id].groups[20] is not before  # reloaded whole
    assert len(window.runs[0].by_step[31]) == 2
    # the step counter goes back: a new timeline, whose old reports are not progress
    store(cluster, "node-01", reports(range(0, 2), range(0, 5), t0 + 60), "c")
    window, _ = assert_same_as_whole(cluster, kept, t0 + 70)
    assert sorted({row.step for row in window.runs[0].steps}) == [0, 1, 2, 3, 4]


@override_settings(ALERT_STEP_WINDOW=WINDOW)
@pytest.mark.django_db(transaction=True)
def test_it_sees_a_batch_that_committed_after_a_pass_it_began_before(cluster):
    """The writer took its transaction id before the pass read the log and committed after:
    a serial or a timestamp would skip it for good; the watermark reads it next pass."""
    t0 = time.time() - 100
    store(cluster, "node-01", reports(range(0, 4), range(0, 25), t0), "a")
    kept = KeptWindow()
    assert_same_as_whole(cluster, kept, t0 + 30)
    late = reports(range(0, 4), range(25, 27), t0)
    with held_open(lambda: store(cluster, "node-01", late, "late")):
        # a later writer (another run: the first holds its run's row) commits first, and is read
        store(cluster, "node-02", reports(range(0, 2), range(0, 3), t0), "quick", run="gpt")
        window, _ = assert_same_as_whole(cluster, kept, t0 + 31)  # the late batch: not yet
        assert 25 not in window.runs[0].by_step and len(window.runs) == 2
    window, _ = assert_same_as_whole(cluster, kept, t0 + 32)
    assert len(window.runs[0].by_step[25]) == 4


@override_settings(ALERT_STEP_WINDOW=60)
@pytest.mark.django_db
def test_a_pass_with_kept_results_finds_what_a_fresh_one_finds(cluster):
    """Pass after pass a kept window and the detectors' kept per-step results name the same
    straggler as a fresh load does, with the same evidence."""
    t0 = time.time() - 400
    kept = KeptWindow()
    for chunk in range(8):
        numbers = range(10 * chunk, 10 * chunk + 10)
        store(cluster, "node-01", reports(range(0, 4), numbers, t0, slow=2), f"a{chunk}")
        store(cluster, "node-02", reports(range(4, 8), numbers, t0), f"b{chunk}")
        now = t0 + 10 * chunk + 11
        window = cluster_window(cluster=cluster, now=now, kept=kept)
        found = detect_all(window, now, kept=kept.results)
        assert found == detect_all(cluster_window(cluster=cluster, now=now), now)
        assert len(kept.results) > 0
    assert [f.subject for f in found if f.kind == "straggler"] == ["run:llama/rank:2"]


@pytest.mark.django_db
def test_the_periodic_pass_keeps_the_window(cluster):
    t0 = time.time() - 100
    store(cluster, "node-01", reports(range(0, 2), range(0, 10), t0), "a")
    alerts_evaluate(cluster=cluster, now=t0 + 11)
    from apps.alerts.selectors.kept import kept_window

    kept = kept_window(cluster_id=cluster.pk)
    assert kept.watermark is not None and len(kept.runs) == 1
    alerts_evaluate(cluster=cluster, now=t0 + 12, as_of=True)  # a replay leaves it alone
    assert kept_window(cluster_id=cluster.pk) is kept


@pytest.mark.django_db
def test_a_worker_keeps_windows_within_its_row_budget(cluster):
    """Past ALERT_KEPT_MAX_ROWS the least recently evaluated clusters' windows go (they read
    whole next time); the one being evaluated always stays."""
    from apps.alerts.selectors.kept import _KEPT, kept_window

    t0 = time.time() - 100
    other = Cluster.objects.create(name="kept-other")
    store(cluster, "node-01", reports(range(0, 4), range(0, 10), t0), "a")  # 40 rows
    store(other, "node-02", reports(range(0, 2), range(0, 10), t0), "b", run="gpt")  # 20 rows
    _KEPT.clear()
    with override_settings(ALERT_KEPT_MAX_ROWS=30):
        alerts_evaluate(cluster=cluster, now=t0 + 11)
        assert kept_window(cluster_id=cluster.pk).rows() == 40  # over 30, and evaluated: kept
        alerts_evaluate(cluster=other, now=t0 + 11)  # 40 held beside it > 30: they go
        assert set(_KEPT) == {other.pk} and _KEPT[other.pk].rows() == 20
        assert kept_window(cluster_id=cluster.pk).rows() == 0  # read whole next pass
        assert set(_KEPT) == {cluster.pk, other.pk}  # 20 beside it ≤ 30: the other stays
    with override_settings(ALERT_KEPT_MAX_ROWS=10):
        kept_window(cluster_id=cluster.pk)
        assert set(_KEPT) == {cluster.pk}
