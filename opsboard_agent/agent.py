"""The node agent's loop: every `interval` seconds, run each collector; every `batch_seconds`
spool what the ticks since the last batch collected as one batch (one POST)."""

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
    bunching them up.

    Ticks are gathered into one batch until `batch_seconds` have passed since the last
    (0: a batch a tick). A POST costs the server ≈ 45 KB of WAL whatever it carries
    (docs/scaling.md), so a node sampling every second posts ten ticks at once; the first
    tick goes alone, so a node shows up as soon as it starts."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        shipper: Shipper,
        interval: float = 10.0,
        batch_seconds: float = 0.0,
    ) -> None:
        self.collectors = list(collectors)
        self.shipper = shipper
        self.interval = interval
        self.batch_seconds = batch_seconds
        self.ticks = 0
        self.collector_errors = 0
        self._failing: set[str] = set()
        self._batched_at: float | None = None  # the collect time of the last tick spooled

    def tick(self, now: float | None = None) -> list[str]:
        """One round of collection; returns the batch_ids spooled (none while the ticks
        are still being gathered)."""
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
        if not self._batch_due(now):
            return []
        self._batched_at = now
        return self.shipper.flush()

    def _batch_due(self, now: float) -> bool:
        # Half an interval of slack: ticks drift by a few ms, and the tick that completes a
        # batch must not wait for the next one.
        return (
            self._batched_at is None
            or now - self._batched_at >= self.batch_seconds - self.interval / 2
        )

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
