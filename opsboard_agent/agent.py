"""The node agent's loop: every `interval` seconds, run each collector and spool one batch."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from opsboard_agent.collectors import Collector
from opsboard_agent.collectors.scrape import ScrapeCollector
from opsboard_agent.records import Sample, sample
from opsboard_agent.shipper import Shipper

log = logging.getLogger(__name__)


class Agent:
    """Collect → shipper. One collector failing (raising) costs only its own samples for
    that tick; the loop keeps its cadence and skips ticks it is too late for rather than
    bunching them up."""

    def __init__(
        self, collectors: Sequence[Collector], shipper: Shipper, interval: float = 10.0
    ) -> None:
        self.collectors = list(collectors)
        self.shipper = shipper
        self.interval = interval
        self.ticks = 0
        self.collector_errors = 0
        self._failing: set[str] = set()

    def tick(self, now: float | None = None) -> list[str]:
        """One round of collection; returns the batch_ids spooled."""
        now = time.time() if now is None else now
        for collector in self.collectors:
            try:
                samples, encoded = collector.collect_encoded(now)
                events = collector.take_events()
            except Exception:
                self.collector_errors += 1
                if collector.name not in self._failing:
                    log.exception("collector %s failed", collector.name)
                self._failing.add(collector.name)
                continue
            self._failing.discard(collector.name)
            self.shipper.add(samples=samples, events=events, encoded=encoded)
        self.shipper.add(samples=self._self_metrics(now))
        self.ticks += 1
        return self.shipper.flush()

    def _self_metrics(self, now: float) -> list[Sample]:
        values = {"agent.collector_errors": float(self.collector_errors)}
        scrape_errors = [c.errors for c in self.collectors if isinstance(c, ScrapeCollector)]
        if scrape_errors:
            values["agent.scrape_errors"] = float(sum(scrape_errors))
        return [s for metric, value in values.items() if (s := sample(now, metric, value))]

    def run(self, stop: threading.Event) -> None:
        """Tick until `stop` is set."""
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                self.tick()
            except OSError:  # the spool's disk; the next tick tries again
                log.exception("could not spool this tick's batch")
            next_tick += self.interval
            late = time.monotonic() - next_tick
            if late > 0:
                next_tick += (late // self.interval + 1) * self.interval
            stop.wait(max(0.0, next_tick - time.monotonic()))
