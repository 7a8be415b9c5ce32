"""Heavy-tailed jitter for hand-built windows: lognormal per-step noise and rare spikes.

Deterministic per (seed, rank, step), so a hypothesis example or a seed replays exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable


def jitter(
    seed: int, cv: float, spike_every: int = 100, spike: tuple[float, float] = (2.0, 5.0)
) -> Callable[[int, int], float]:
    """(rank, step) → a multiplier with median 1: lognormal with coefficient of variation
    `cv`, times a 2–5× spike about once every `spike_every` reports (GC pauses,
    pre-emption, page-fault storms)."""
    sigma = math.sqrt(math.log(1 + cv * cv))

    def factor(rank: int, step: int) -> float:
        rng = random.Random(f"{seed}:{rank}:{step}")
        value = rng.lognormvariate(0.0, sigma)
        if spike_every and rng.random() < 1 / spike_every:
            value *= rng.uniform(*spike)
        return value

    return factor


def noisy(values: list[float], seed: int, cv: float, spike_every: int = 100) -> list[float]:
    """A telemetry series with the same jitter (per sample)."""
    f = jitter(seed, cv, spike_every)
    return [v * f(0, i) for i, v in enumerate(values)]
