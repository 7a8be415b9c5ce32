"""apps.core.counters: counts from many processes add up in Redis; a process's gauge stops
counting once it is no longer heard from."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from apps.core import counters
from apps.core.redis import redis_client

pytestmark = [pytest.mark.django_db]


def _count_in_child(times: int) -> None:
    for _ in range(times):
        counters.counter_add("opsboard_test_forked_total", {"kind": "child"})
    counters.flush()
    os._exit(0)


def test_counts_from_forked_processes_add_up_without_counting_the_parents_twice():
    key = ("opsboard_test_forked_total", (("kind", "child"),))
    before = counters.counters_read().get(key, 0.0)
    counters.counter_add("opsboard_test_forked_total", {"kind": "child"}, 100)  # pending here
    children = [multiprocessing.get_context("fork").Process(target=_count_in_child, args=(5,))
                for _ in range(3)]  # fmt: skip
    for child in children:
        child.start()
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert counters.counters_read()[key] - before == 100 + 3 * 5


def test_a_histogram_reads_back_by_bucket():
    name = f"opsboard_test_{os.getpid()}_{time.monotonic_ns()}_seconds"
    for seconds in (0.01, 0.2, 0.3, 99.0):
        counters.histogram_observe(name, seconds, (0.1, 1.0))
    read = counters.counters_read()
    assert read[(f"{name}_bucket", (("le", "0.1"),))] == 1
    assert read[(f"{name}_bucket", (("le", "1.0"),))] == 2
    assert read[(f"{name}_bucket", (("le", "+Inf"),))] == 1
    assert read[(f"{name}_count", ())] == 4
    assert read[(f"{name}_sum", ())] == pytest.approx(99.51)


def test_a_process_not_heard_from_stops_counting_in_a_gauge():
    from django.conf import settings

    key = counters.GAUGES_KEY.format(prefix=settings.REDIS_PREFIX)
    name = f"opsboard_test_gauge_{os.getpid()}"
    now = time.time()
    redis_client().hset(key, f"{name}|gone:1", json.dumps([7, now - counters.GAUGE_STALE_S - 1]))
    redis_client().hset(key, f"{name}|alive:2", json.dumps([3, now]))
    counters.gauge_add(name, 2)
    assert counters.gauges_read()[name] == 3 + 2
    assert not redis_client().hexists(key, f"{name}|gone:1")
    counters.gauge_add(name, -2)
    redis_client().hdel(key, f"{name}|alive:2")
    assert counters.gauges_read().get(name, 0) == 0
