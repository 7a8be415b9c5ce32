"""Host telemetry from psutil: CPU, memory, and network/disk throughput as rates."""

from __future__ import annotations

import psutil

from opsboard_agent.collectors import Collector
from opsboard_agent.rates import RateTracker
from opsboard_agent.records import Sample, sample

RATE_METRICS = {
    "net_rx": "host.net_rx_bytes_per_s",
    "net_tx": "host.net_tx_bytes_per_s",
    "disk_read": "host.disk_read_bytes_per_s",
    "disk_write": "host.disk_write_bytes_per_s",
}


def host_counters() -> dict[str, float]:
    """Byte counters summed over non-loopback NICs and all disks.

    Loopback is left out because it is not network throughput (a local server talking to
    itself would dominate). A source psutil cannot read here (no disks in a container) is
    simply absent."""
    counters: dict[str, float] = {}
    nics = psutil.net_io_counters(pernic=True) or {}
    wire = [c for name, c in nics.items() if name != "lo" and not name.startswith("lo:")]
    if wire:
        counters["net_rx"] = float(sum(c.bytes_recv for c in wire))
        counters["net_tx"] = float(sum(c.bytes_sent for c in wire))
    disks = psutil.disk_io_counters(perdisk=False)
    if disks is not None:
        counters["disk_read"] = float(disks.read_bytes)
        counters["disk_write"] = float(disks.write_bytes)
    return counters


class HostCollector(Collector):
    """`host.*` core metrics. CPU utilisation and the rates cover the time since the previous
    collect, so the first collect has CPU (since construction) but no rates."""

    name = "host"

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # primes the CPU-time baseline
        self._rates = RateTracker()

    def collect(self, now: float) -> list[Sample]:
        memory = psutil.virtual_memory()
        # "used" as total minus available: what applications hold, page cache excluded,
        # consistent across kernels (psutil's own `used` differs by platform).
        values = {
            "host.cpu_util": psutil.cpu_percent(interval=None),
            "host.mem_total_bytes": float(memory.total),
            "host.mem_used_bytes": float(memory.total - memory.available),
        }
        for key, rate in self._rates.update(host_counters(), now).items():
            values[RATE_METRICS[key]] = rate
        return [s for metric, value in values.items() if (s := sample(now, metric, value))]
