"""The psutil host collector on this machine."""

import time

import psutil

from opsboard_agent.collectors.host import HostCollector
from opsboard_agent.records import METRIC_RE


def by_metric(samples):
    return {s["metric"]: s for s in samples}


def test_it_reports_plausible_host_values():
    collector = HostCollector()
    first = by_metric(collector.collect(time.time()))
    time.sleep(0.3)
    second = by_metric(collector.collect(time.time()))
    total = psutil.virtual_memory().total
    assert second["host.mem_total_bytes"]["value"] == total
    assert 0 < second["host.mem_used_bytes"]["value"] <= total
    assert 0 <= second["host.cpu_util"]["value"] <= 100
    assert not any(m.endswith("_per_s") for m in first)  # no interval yet
    for metric, record in second.items():
        assert METRIC_RE.match(metric) and "gpu" not in record
        if metric.endswith("_per_s"):
            assert record["value"] >= 0


def test_rates_stay_non_negative_across_a_counter_reset():
    collector = HostCollector()
    now = time.time()
    collector._rates.update(
        {"net_rx": 1e12, "net_tx": 1e12, "disk_read": 1e12, "disk_write": 1e12}, now - 1
    )
    # The real counters are far below 1e12: to the collector this is a reset.
    after_reset = by_metric(collector.collect(now))
    assert not any(m.endswith("_per_s") for m in after_reset)
    time.sleep(0.2)
    later = by_metric(collector.collect(time.time()))
    assert all(later[m]["value"] >= 0 for m in later if m.endswith("_per_s"))
