"""Per-second rates from monotonically increasing counters (network and disk bytes, NVLink
data). Pure: the caller owns the clock and the readings."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def counter_rates(
    previous: Mapping[K, float], previous_ts: float, current: Mapping[K, float], ts: float
) -> dict[K, float]:
    """Rates (units per second) for the counters present in both readings.

    A counter that went down (a reset: driver reload, NIC re-created, 32-bit wrap the source
    did not hide) gives no rate for this interval rather than a negative or huge one; so does
    a non-positive interval. The next interval, measured from the new value, is fine again."""
    if ts <= previous_ts:
        return {}
    rates: dict[K, float] = {}
    for key, value in current.items():
        before = previous.get(key)
        if (
            before is not None
            and (rate := counter_rate(previous_ts, before, ts, value)) is not None
        ):
            rates[key] = rate
    return rates


def counter_rate(before_ts: float, before: float, ts: float, value: float) -> float | None:
    """One counter's rate from its reading `before` at `before_ts` to `value` at `ts`, or
    None over a reset (the value went down) or a non-positive interval (counter_rates)."""
    if ts <= before_ts or value < before:
        return None
    return (value - before) / (ts - before_ts)


class RateTracker:
    """Keeps the previous reading so that each `update` returns the rates since the last one.
    The first update returns nothing (no interval yet)."""

    def __init__(self) -> None:
        self._previous: dict[str, float] | None = None
        self._previous_ts = 0.0

    def update(self, current: Mapping[str, float], ts: float) -> dict[str, float]:
        rates = (
            {}
            if self._previous is None
            else counter_rates(self._previous, self._previous_ts, current, ts)
        )
        if ts > self._previous_ts or self._previous is None:
            self._previous, self._previous_ts = dict(current), ts
        return rates
