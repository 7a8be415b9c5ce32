"""Collectors: each is a small object whose `collect(now)` returns contract samples.

A collector that also sees discrete happenings (an XID error, new ECC errors) hands them out
as contract events from `take_events()`; the agent drains both after every collect. A
collector never raises for an absent source (no driver, exporter down): it reports itself
unavailable once in the log and returns nothing."""

from __future__ import annotations

from abc import ABC, abstractmethod

from opsboard_agent.records import EncodedSamples, Event, Sample


class Collector(ABC):
    name = "collector"

    @abstractmethod
    def collect(self, now: float) -> list[Sample]:
        """Samples read at `now` (empty when the source is unavailable)."""

    def collect_encoded(self, now: float) -> tuple[list[Sample], list[EncodedSamples]]:
        """What the agent calls: samples, and samples already encoded as JSON."""
        return self.collect(now), []

    def take_events(self) -> list[Event]:
        """Events seen since the last call (none by default)."""
        return []

    def close(self) -> None:  # noqa: B027 - most collectors hold nothing to release
        """Release what the collector holds (NVML, sockets); it is not used afterwards."""
