"""A periodic worker keeps each cluster's telemetry window between passes and reads only each
node's span that got samples (apps.alerts.selectors.kept_telemetry, apps.telemetry.changes):
the series it hands the detectors are the ones a whole read gives, whatever arrived late,
twice, densely, stamped ahead of the clock, or was compacted meanwhile."""

import time
from datetime import UTC, datetime

import pytest
from django.test import override_settings

from apps.alerts.selectors import cluster_window
from apps.alerts.selectors.kept import KeptWindow
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store
from apps.telemetry.changes import sample_changes_prune
from apps.telemetry.services import chunks_compact
from detectors import detect_all
from tests.alerts.held_writer import held_open


def store(cluster: Cluster, node: str, samples: list[dict], key: str) -> None:
    body = {"batch_id": key, "node": node, "samples": samples}
    batches_store(
        batches=[ClaimedBatch.of(cluster_id=cluster.pk, received_at=datetime.now(UTC), body=body)]
    )


def temps(times: list[float], gpus: range = range(2), base: float = 60.0) -> list[dict]:
    return [
        {"ts": t, "metric": "gpu.temp_c", "gpu": gpu, "value": base + gpu + (t % 7)}
        for t in times
        for gpu in gpus
    ]


def seconds(t0: float, first: int, count: int, step: float = 1.0) -> list[float]:
    return [t0 + first + i * step for i in range(int(count / step))]


def same_as_whole(cluster: Cluster, kept: KeptWindow, now: float):
    window = cluster_window(cluster=cluster, now=now, kept=kept)
    whole = cluster_window(cluster=cluster, now=now)
    assert window.telemetry == whole.telemetry
    assert detect_all(window, now) == detect_all(whole, now)
    return {(s.node, s.gpu): s for s in window.telemetry}


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="kept-telemetry")


# Transactional: inside a test's one transaction every change is its own, and a reader reads
# again all the changes of transactions still running (its own included).
@override_settings(ALERT_TELEMETRY_WINDOW_S=120.0, ALERT_TELEMETRY_RESOLUTION_S=1.0)
@pytest.mark.django_db(transaction=True)
def test_it_reads_only_what_changed_and_matches_a_whole_read(cluster):
    t0 = float(int(time.time())) - 300 + 0.25
    store(cluster, "node-01", temps(seconds(t0, 0, 200)), "a")
    store(cluster, "node-02", temps(seconds(t0, 0, 200)), "b")
    kept = KeptWindow()
    first = same_as_whole(cluster, kept, t0 + 200.4)
    assert len(first["node-01", 0].points) == 119  # t0 + 81.25 … t0 + 199.25
    # node-01 goes on at 1 Hz; node-02 says nothing new
    store(cluster, "node-01", temps(seconds(t0, 200, 10)), "c")
    second = same_as_whole(cluster, kept, t0 + 210.4)
    assert second["node-02", 1] is first["node-02", 1] or (
        second["node-02", 1].points == first["node-02", 1].points[10:]
    )
    assert second["node-01", 0].points[-1][0] == pytest.approx(t0 + 209)
    # a late batch inside the window, dense (10 a second: a point a second kept, the newest),
    # the same batch sent again, and a sample stamped ahead of the server's clock
    store(cluster, "node-02", temps(seconds(t0 + 0.05, 150, 20, step=0.1), base=80.0), "late")
    store(cluster, "node-02", temps(seconds(t0 + 0.05, 150, 20, step=0.1), base=80.0), "late")
    store(cluster, "node-01", temps([t0 + 240.0]), "ahead")
    third = same_as_whole(cluster, kept, t0 + 211.4)
    late = [v for ts, v in third["node-02", 0].points if t0 + 150 <= ts < t0 + 170]
    assert len(late) == 20 and min(late) >= 80.0
    assert third["node-01", 0].points[-1][0] < t0 + 212  # not yet: past the window's end
    unchanged = same_as_whole(cluster, kept, t0 + 211.4)
    assert unchanged["node-02", 1] is third["node-02", 1]  # the same Series: nothing changed
    # a late point in a slot that has one: as many points, the same first and last
    store(cluster, "node-02", temps([t0 + 120.5], base=99.0), "late-2")
    replaced = same_as_whole(cluster, kept, t0 + 211.4)
    assert len(replaced["node-02", 1].points) == len(third["node-02", 1].points)
    assert (t0 + 120.5, 99.0 + 1 + (t0 + 120.5) % 7) in replaced["node-02", 1].points
    later = same_as_whole(cluster, kept, t0 + 240.4)  # the window's end passed it
    assert later["node-01", 0].points[-1][0] == pytest.approx(t0 + 240.0)
    assert later["node-02", 0].points[0][0] >= t0 + 240.4 - 120  # the old ones dropped


@override_settings(ALERT_TELEMETRY_WINDOW_S=600.0, TELEMETRY_CHUNK_SECONDS=60)
@pytest.mark.django_db(transaction=True)
def test_compaction_and_a_pruned_log_between_passes(cluster):
    t0 = float(int(time.time()) // 60 * 60) - 420
    for minute in range(6):
        store(cluster, "node-01", temps(seconds(t0, 60 * minute, 60)), f"m{minute}")
    kept = KeptWindow()
    before = same_as_whole(cluster, kept, t0 + 400.0)
    assert chunks_compact(now=datetime.fromtimestamp(t0 + 420, UTC)) > 0  # rewritten, same points
    after = same_as_whole(cluster, kept, t0 + 400.0)
    assert after["node-01", 0] is before["node-01", 0]  # nothing to read again
    # a late sample in a sealed minute: its span is read from a sealed row and a raw one
    store(cluster, "node-01", temps([t0 + 100.5], base=99.0), "late")
    late = same_as_whole(cluster, kept, t0 + 400.0)
    assert (t0 + 100.5, 99.0 + (t0 + 100.5) % 7) in late["node-01", 0].points
    assert len(late["node-01", 0].points) == len(before["node-01", 0].points)  # its slot's
    assert t0 + 100 not in [ts for ts, _ in late["node-01", 0].points]  # newest, now
    store(cluster, "node-01", temps(seconds(t0, 360, 5)), "new")
    sample_changes_prune(keep_s=0)  # the log lost a change this window has not read
    whole = same_as_whole(cluster, kept, t0 + 366.0)  # so it reads whole
    assert whole["node-01", 0].points[-1][0] == pytest.approx(t0 + 364)
    assert whole["node-01", 0] is not before["node-01", 0]


@override_settings(ALERT_TELEMETRY_WINDOW_S=120.0)
@pytest.mark.django_db(transaction=True)
def test_it_sees_samples_that_committed_after_a_pass_it_began_before(cluster):
    t0 = float(int(time.time())) - 200
    store(cluster, "node-01", temps(seconds(t0, 0, 100)), "a")
    kept = KeptWindow()
    same_as_whole(cluster, kept, t0 + 101)
    slow = temps(seconds(t0, 100, 3), base=90.0)
    with held_open(lambda: store(cluster, "node-01", slow, "slow")):
        store(cluster, "node-02", temps(seconds(t0, 0, 104)), "quick")  # commits first, read
        window = same_as_whole(cluster, kept, t0 + 104)
        assert ("node-02", 0) in window and window["node-01", 0].points[-1][0] < t0 + 100
    window = same_as_whole(cluster, kept, t0 + 104)
    assert window["node-01", 0].points[-1][1] >= 90.0
